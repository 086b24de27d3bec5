//! The lenient frontmatter parser the compiler uses (letta-code's
//! `parseFrontmatter`), reproduced rule for rule because its quirks show up in
//! the compiled prompt:
//!
//! * one leading U+FEFF is removed; CRLF, then any lone CR, become LF;
//! * frontmatter is `---\n`, the shortest run of text, `\n---`, then end of
//!   text or `\n` + body. `--- ` (trailing space) does not close the block;
//! * without a match the body is the normalised text, untrimmed; with a match
//!   it is trimmed (JavaScript whitespace set);
//! * keys are a tiny YAML subset: `key: value` (quotes kept as written),
//!   `key:` followed by `- item` lines (a list), everything else ignored.
//!
//! Strict validation of memory files (exactly `name` + `description`) is the
//! validator's job, not this parser's.

use std::collections::BTreeMap;

use super::text::js_trim;

/// A frontmatter value: a plain string or a list of `- item` strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontmatterValue {
    Text(String),
    List(Vec<String>),
}

/// The result of [`parse_frontmatter`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    pub fields: BTreeMap<String, FrontmatterValue>,
    pub body: String,
}

impl Parsed {
    /// The trimmed `description` when it is a plain string, else `""` (what the
    /// compiler renders).
    pub fn description(&self) -> &str {
        match self.fields.get("description") {
            Some(FrontmatterValue::Text(t)) => js_trim(t),
            _ => "",
        }
    }
}

/// Normalise line endings and strip one leading BOM.
pub fn normalize(text: &str) -> String {
    let text = text.strip_prefix('\u{FEFF}').unwrap_or(text);
    text.replace("\r\n", "\n").replace('\r', "\n")
}

/// Split normalised text into (frontmatter text, rest) per the lazy regex
/// `^---\n([\s\S]*?)\n---(?:\n([\s\S]*))?$`.
fn split_block(normalized: &str) -> Option<(&str, &str)> {
    let rest = normalized.strip_prefix("---\n")?;
    let mut from = 0;
    while let Some(found) = rest[from..].find("\n---") {
        let at = from + found;
        let after = &rest[at + 4..];
        if after.is_empty() {
            return Some((&rest[..at], ""));
        }
        if let Some(body) = after.strip_prefix('\n') {
            return Some((&rest[..at], body));
        }
        from = at + 1;
    }
    None
}

/// Parse `text` the way letta-code's compiler does.
pub fn parse_frontmatter(text: &str) -> Parsed {
    let normalized = normalize(text);
    let Some((block, body)) = split_block(&normalized) else {
        return Parsed {
            fields: BTreeMap::new(),
            body: normalized,
        };
    };

    let mut fields = BTreeMap::new();
    let mut pending: Option<(String, Vec<String>)> = None;
    let flush = |pending: &mut Option<(String, Vec<String>)>,
                 fields: &mut BTreeMap<String, FrontmatterValue>| {
        if let Some((key, items)) = pending.take() {
            let value = if items.is_empty() {
                FrontmatterValue::Text(String::new())
            } else {
                FrontmatterValue::List(items)
            };
            fields.insert(key, value);
        }
    };

    for line in block.split('\n') {
        let trimmed = js_trim(line);
        if let (Some(stripped), Some((_, items))) = (trimmed.strip_prefix('-'), pending.as_mut()) {
            items.push(js_trim(stripped).to_string());
            continue;
        }
        flush(&mut pending, &mut fields);
        // `indexOf(":") > 0`: a colon that is not the first character.
        match line.find(':') {
            Some(colon) if colon > 0 => {
                let key = js_trim(&line[..colon]).to_string();
                let value = js_trim(&line[colon + 1..]);
                if value.is_empty() {
                    // JS tests the pending key for truthiness: an empty key
                    // never becomes pending and is dropped.
                    if !key.is_empty() {
                        pending = Some((key, Vec::new()));
                    }
                } else {
                    fields.insert(key, FrontmatterValue::Text(value.to_string()));
                }
            }
            _ => {}
        }
    }
    flush(&mut pending, &mut fields);

    Parsed {
        fields,
        body: js_trim(body).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> FrontmatterValue {
        FrontmatterValue::Text(s.to_string())
    }

    #[test]
    fn basic_block_and_trimmed_body() {
        let p =
            parse_frontmatter("---\nname: Human\ndescription: The user\n---\n\n- likes pnpm\n\n");
        assert_eq!(p.fields.get("name"), Some(&text("Human")));
        assert_eq!(p.description(), "The user");
        assert_eq!(p.body, "- likes pnpm");
    }

    #[test]
    fn bom_crlf_and_cr_only_are_normalised() {
        let crlf = parse_frontmatter("\u{FEFF}---\r\ndescription: d\r\n---\r\nbody\r\n");
        assert_eq!(crlf.description(), "d");
        assert_eq!(crlf.body, "body");
        let cr = parse_frontmatter("---\rdescription: d\r---\rline1\rline2");
        assert_eq!(cr.description(), "d");
        assert_eq!(cr.body, "line1\nline2");
    }

    #[test]
    fn no_match_keeps_body_untrimmed() {
        let p = parse_frontmatter("\n# Memory\n\n");
        assert!(p.fields.is_empty());
        assert_eq!(p.body, "\n# Memory\n\n");
        // A leading blank line means no frontmatter.
        let p = parse_frontmatter("\n---\ndescription: d\n---\nx");
        assert!(p.fields.is_empty());
    }

    #[test]
    fn closing_fence_rules() {
        // Trailing space does not close; the next bare `---` line does.
        let p = parse_frontmatter("---\ndescription: d\n--- \nmid\n---\nbody");
        assert_eq!(p.description(), "d");
        assert_eq!(p.body, "body");
        // Only frontmatter, no final newline.
        let p = parse_frontmatter("---\ndescription: d\n---");
        assert_eq!(p.description(), "d");
        assert_eq!(p.body, "");
        // Empty block needs the blank line.
        let p = parse_frontmatter("---\n\n---\nbody");
        assert!(p.fields.is_empty());
        assert_eq!(p.body, "body");
        let p = parse_frontmatter("---\n---\nbody");
        assert_eq!(p.body, "---\n---\nbody");
        // `---x` is not a closing line.
        let p = parse_frontmatter("---\ndescription: d\n---x\n");
        assert_eq!(p.body, "---\ndescription: d\n---x\n");
        // Never closed.
        let p = parse_frontmatter("---\ndescription: d\nbody");
        assert!(p.fields.is_empty());
    }

    #[test]
    fn yaml_subset() {
        let p = parse_frontmatter(
            "---\ndescription:\n  - a\n  - b\nname: \"Quoted\"\n:skip\nnocolon\nempty:\nurl: http://x:1\n---\n",
        );
        assert_eq!(
            p.fields.get("description"),
            Some(&FrontmatterValue::List(vec!["a".into(), "b".into()]))
        );
        assert_eq!(p.description(), "");
        assert_eq!(p.fields.get("name"), Some(&text("\"Quoted\"")));
        assert_eq!(p.fields.get("empty"), Some(&text("")));
        assert_eq!(p.fields.get("url"), Some(&text("http://x:1")));
        assert!(!p.fields.contains_key(""));
    }

    #[test]
    fn later_duplicates_win_and_description_is_js_trimmed() {
        let p = parse_frontmatter("---\ndescription: one\ndescription: \u{3000}two\u{FEFF}\n---\n");
        assert_eq!(p.description(), "two");
    }
}
