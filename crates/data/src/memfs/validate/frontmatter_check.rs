//! Per-file frontmatter rules (`validateMemoryFileFrontmatter`, spec §2.4).
//!
//! Deliberately line-based, not YAML: the rules are the contract the agent
//! is told about, and a YAML parser would accept shapes the hook rejects.
//! Content is split on `\n` only, so a CRLF file's first line is `---\r`
//! and it fails as "missing frontmatter".

/// Which rule set applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontmatterFormat {
    /// MemFS v2: exactly `name` + `description`; `MEMORY.md` has none.
    MemfsV2,
    /// Legacy `system/`/`reference/`: `description`, tolerated `limit`,
    /// protected `read_only`.
    Legacy,
}

/// Return the frontmatter errors of one file, each a full line
/// (`<path>: ...`). `previous` is the accepted (HEAD) content, used only by
/// the legacy `read_only` protection.
pub fn validate_memory_file_frontmatter(
    path: &str,
    content: &str,
    previous: Option<&str>,
    format: FrontmatterFormat,
) -> Vec<String> {
    let v2 = format == FrontmatterFormat::MemfsV2;
    let lines: Vec<&str> = content.split('\n').collect();
    let first = lines.first().copied().unwrap_or("");
    if v2 && path.rsplit('/').next() == Some("MEMORY.md") {
        return if first == "---" {
            vec![format!("{path}: MEMORY.md must not have frontmatter")]
        } else {
            Vec::new()
        };
    }
    if first != "---" {
        return vec![format!("{path}: missing frontmatter (must start with ---)")];
    }
    let Some(closing) = lines
        .iter()
        .skip(1)
        .position(|l| *l == "---")
        .map(|i| i + 1)
    else {
        return vec![format!(
            "{path}: frontmatter opened but never closed (missing closing ---)"
        )];
    };
    // JavaScript treats an empty previous content as "no previous content".
    let previous = previous.filter(|p| !p.is_empty());
    if !v2 && previous.is_some_and(|p| legacy_value(p, "read_only") == "true") {
        return vec![format!("{path}: file is read_only and cannot be modified")];
    }

    let mut fields = Fields::new(path, v2, previous);
    for line in &lines[1..closing] {
        fields.check_line(line);
    }
    let Fields {
        mut errors, seen, ..
    } = fields;
    let required: &[&str] = if v2 {
        &["name", "description"]
    } else {
        &["description"]
    };
    for key in required {
        if !seen.iter().any(|k| k == key) {
            errors.push(format!("{path}: missing required field '{key}'"));
        }
    }
    if !v2
        && !legacy_value(previous.unwrap_or(""), "read_only").is_empty()
        && legacy_value(content, "read_only").is_empty()
    {
        errors.push(format!(
            "{path}: 'read_only' is a protected field and cannot be removed by the agent"
        ));
    }
    errors
}

/// The per-line checks of one file's frontmatter block, in line order:
/// the errors found so far and the keys seen (for duplicates and the
/// required fields).
struct Fields<'a> {
    path: &'a str,
    v2: bool,
    /// The accepted content (empty counts as none), for the legacy
    /// `read_only` protection.
    previous: Option<&'a str>,
    allowed: &'static [&'static str],
    errors: Vec<String>,
    seen: Vec<String>,
}

impl<'a> Fields<'a> {
    fn new(path: &'a str, v2: bool, previous: Option<&'a str>) -> Self {
        let allowed: &'static [&'static str] = if v2 {
            &["name", "description"]
        } else {
            &["description", "read_only", "limit"]
        };
        Fields {
            path,
            v2,
            previous,
            allowed,
            errors: Vec::new(),
            seen: Vec::new(),
        }
    }

    /// Check one line between the opening and closing `---`.
    fn check_line(&mut self, line: &str) {
        let (path, v2) = (self.path, self.v2);
        if line.is_empty() {
            return;
        }
        // Legacy descriptions may continue on indented YAML lines; v2 has
        // two scalar fields, so an indented line is just an unknown key.
        if !v2 && (line.starts_with(' ') || line.starts_with('\t')) {
            return;
        }
        let (raw_key, raw_value) = match line.find(':') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line, line),
        };
        let key = if v2 {
            trim_spaces(raw_key).to_string()
        } else {
            raw_key.replace(' ', "")
        };
        let value = trim_spaces(raw_value);
        if !self.allowed.contains(&key.as_str()) {
            self.errors.push(format!(
                "{path}: unknown frontmatter key '{key}' (allowed: {})",
                self.allowed.join(" ")
            ));
            return;
        }
        if v2 && self.seen.contains(&key) {
            self.errors
                .push(format!("{path}: duplicate frontmatter key '{key}'"));
        }
        if !self.seen.contains(&key) {
            self.seen.push(key.clone());
        }
        if key == "read_only" {
            self.check_read_only(value);
        }
        if (v2 || key == "description")
            && (value.is_empty() || (v2 && (value == "\"\"" || value == "''")))
        {
            self.errors
                .push(format!("{path}: '{key}' must not be empty"));
        }
    }

    /// A legacy `read_only` line: the agent may neither set the field nor
    /// change the accepted value.
    fn check_read_only(&mut self, value: &str) {
        let path = self.path;
        match self.previous {
            None => self.errors.push(format!(
                "{path}: 'read_only' is a protected field and cannot be set by the agent"
            )),
            Some(p) if value != legacy_value(p, "read_only") => self.errors.push(format!(
                "{path}: 'read_only' is a protected field and cannot be changed by the agent"
            )),
            Some(_) => {}
        }
    }
}

/// The hook's scalar lookup: every `key:` line inside the frontmatter,
/// value trimmed of spaces, joined with newlines. No YAML interpretation.
fn legacy_value(text: &str, key: &str) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    let Some(end) = lines
        .iter()
        .skip(1)
        .position(|l| *l == "---")
        .map(|i| i + 1)
    else {
        return String::new();
    };
    let prefix = format!("{key}:");
    lines[1..end]
        .iter()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .map(trim_spaces)
        .collect::<Vec<_>>()
        .join("\n")
}

/// letta-code trims spaces only (`/^ +| +$/`), never tabs.
fn trim_spaces(s: &str) -> &str {
    s.trim_matches(' ')
}

#[cfg(test)]
mod tests {
    use super::*;
    use FrontmatterFormat::*;

    #[test]
    fn v2_valid_and_quoted() {
        let ok = "---\nname: \"Persona\"\ndescription: Who I am\n---\nbody\n";
        assert!(validate_memory_file_frontmatter("persona.md", ok, None, MemfsV2).is_empty());
    }

    #[test]
    fn v2_errors() {
        let c = "---\nname: \"\"\nname: x\nextra: 1\n---\n";
        assert_eq!(
            validate_memory_file_frontmatter("p.md", c, None, MemfsV2),
            vec![
                "p.md: 'name' must not be empty",
                "p.md: duplicate frontmatter key 'name'",
                "p.md: unknown frontmatter key 'extra' (allowed: name description)",
                "p.md: missing required field 'description'",
            ]
        );
    }

    #[test]
    fn crlf_is_missing_frontmatter() {
        let c = "---\r\nname: a\r\ndescription: b\r\n---\r\n";
        assert_eq!(
            validate_memory_file_frontmatter("p.md", c, None, MemfsV2),
            vec!["p.md: missing frontmatter (must start with ---)"]
        );
    }

    #[test]
    fn index_must_not_have_frontmatter() {
        assert_eq!(
            validate_memory_file_frontmatter("a/MEMORY.md", "---\n---\n", None, MemfsV2),
            vec!["a/MEMORY.md: MEMORY.md must not have frontmatter"]
        );
        assert!(
            validate_memory_file_frontmatter("MEMORY.md", "# Memory\n", None, MemfsV2).is_empty()
        );
    }

    #[test]
    fn legacy_read_only_rules() {
        let prev = "---\ndescription: d\nread_only: true\n---\n";
        assert_eq!(
            validate_memory_file_frontmatter(
                "system/a.md",
                "---\ndescription: e\n---\n",
                Some(prev),
                Legacy
            ),
            vec!["system/a.md: file is read_only and cannot be modified"]
        );
        let prev = "---\ndescription: d\nread_only: false\n---\n";
        assert_eq!(
            validate_memory_file_frontmatter(
                "system/a.md",
                "---\ndescription: d\n---\n",
                Some(prev),
                Legacy
            ),
            vec![
                "system/a.md: 'read_only' is a protected field and cannot be removed by the agent"
            ]
        );
        assert_eq!(
            validate_memory_file_frontmatter(
                "system/a.md",
                "---\ndescription: d\nread_only: true\n---\n",
                Some(prev),
                Legacy
            ),
            vec![
                "system/a.md: 'read_only' is a protected field and cannot be changed by the agent"
            ]
        );
        assert_eq!(
            validate_memory_file_frontmatter(
                "system/a.md",
                "---\ndescription: d\nread_only: false\n---\n",
                None,
                Legacy
            ),
            vec!["system/a.md: 'read_only' is a protected field and cannot be set by the agent"]
        );
        assert!(
            validate_memory_file_frontmatter(
                "system/a.md",
                "---\ndescription: d\nlimit: 5\n  more\n---\n",
                None,
                Legacy
            )
            .is_empty()
        );
    }
}
