//! Whole-tree structure and budget rules (`validateMemoryTreeConstraints`,
//! spec §2.5), in letta-code's emission order: root marker, indexes,
//! `readOnlyFiles`, then per file (regular file, formatting, depth, size),
//! then the core budget.

use git2::Repository;

use super::config::ConstraintsConfig;
use super::error::{Stage, ValidateError, read_blob};
use super::glob::Glob;
use super::options::Policy;
use super::report::{Rule, Violation};
use super::snapshot::{Entry, TreeSnapshot};

pub(crate) struct TreeOptions<'a> {
    pub config: &'a ConstraintsConfig,
    pub policy: Policy,
    /// The accepted tree has a root `MEMORY.md` (v2 stays on even if the
    /// candidate deletes it).
    pub require_root_marker: bool,
    /// Trusted tree before this change; needed only for `readOnlyFiles`.
    pub accepted: Option<&'a TreeSnapshot>,
}

/// Legacy projected memory: `(memory/)?(system|reference)/**.md`.
pub(crate) fn is_legacy_memory_path(path: &str) -> bool {
    let p = path.strip_prefix("memory/").unwrap_or(path);
    (p.starts_with("system/") || p.starts_with("reference/")) && path.ends_with(".md")
}

pub(crate) fn validate_tree_constraints(
    repo: &Repository,
    tree: &TreeSnapshot,
    opts: &TreeOptions<'_>,
) -> Result<Vec<Violation>, ValidateError> {
    let mut out = Vec::new();
    let config = opts.config;
    let root_marker = opts.policy == Policy::RootMarker;
    // Index presence counts any `.md` entry, whatever its mode.
    let has_md = |p: &str| p.ends_with(".md") && tree.contains(p);
    let v2 = root_marker && (opts.require_root_marker || has_md("MEMORY.md"));
    if v2 && !has_md("MEMORY.md") {
        out.push(Violation::new(
            Some("MEMORY.md"),
            Rule::RootIndexRequired,
            "MEMORY.md: root memory index is required for MemFS v2".to_string(),
        ));
    }

    let memory_files: Vec<(&str, _)> = tree
        .iter()
        .filter(|(p, _)| p.ends_with(".md") && !p.starts_with("skills/"))
        .filter(|(p, _)| v2 || opts.policy == Policy::SharedMemory || is_legacy_memory_path(p))
        .collect();

    if v2 {
        for (path, _) in &memory_files {
            if let Some(index) = first_missing_index(path, &has_md) {
                out.push(Violation::new(
                    Some(path),
                    Rule::MissingIndex,
                    format!("{path}: missing required index {index}"),
                ));
            }
        }
    }

    if !config.read_only_files.is_empty() {
        let accepted = opts.accepted.ok_or(ValidateError::MissingAcceptedTree)?;
        read_only_violations(config, accepted, tree, &mut out);
    }

    let rules = FileRules {
        repo,
        config,
        overrides: config
            .file_character_limits
            .iter()
            .map(|l| (Glob::new(&l.pattern), l.max_characters))
            .collect(),
        root_marker,
    };
    let mut core_characters: u64 = 0;
    for (path, entry) in &memory_files {
        core_characters += rules.check(path, entry, &mut out)?;
    }
    if root_marker
        && let Some(max) = config.max_core_memory_characters
        && core_characters > max
    {
        out.push(Violation::new(
            None,
            Rule::CoreBudget,
            format!("core memory: {core_characters} characters exceeds {max} from maxCoreMemoryCharacters"),
        ));
    }
    Ok(out)
}

/// `readOnlyFiles`: a matching path created, changed or removed against
/// the accepted tree.
fn read_only_violations(
    config: &ConstraintsConfig,
    accepted: &TreeSnapshot,
    tree: &TreeSnapshot,
    out: &mut Vec<Violation>,
) {
    let globs: Vec<Glob> = config
        .read_only_files
        .iter()
        .map(|p| Glob::new(p))
        .collect();
    // Accepted paths first, then paths only the candidate has (the
    // order of letta-code's Set over both listings).
    let accepted_paths = accepted.iter().map(|(p, _)| p);
    let created = tree
        .iter()
        .map(|(p, _)| p)
        .filter(|p| !accepted.contains(p));
    for path in accepted_paths.chain(created) {
        if !globs.iter().any(|g| g.is_match(path)) {
            continue;
        }
        // Same mode and same object id = same bytes (content-addressed).
        if accepted.get(path) != tree.get(path) {
            out.push(Violation::new(
                Some(path),
                Rule::ReadOnly,
                format!("{path}: read-only file cannot be created, changed or removed"),
            ));
        }
    }
}

/// The per-file rules: regular file, formatting, depth, size.
struct FileRules<'a> {
    repo: &'a Repository,
    config: &'a ConstraintsConfig,
    /// `fileCharacterLimits`, in order (the first match wins).
    overrides: Vec<(Glob, Option<u64>)>,
    root_marker: bool,
}

impl FileRules<'_> {
    /// Check one memory file; returns the characters it adds to the core
    /// budget.
    fn check(
        &self,
        path: &str,
        entry: &Entry,
        out: &mut Vec<Violation>,
    ) -> Result<u64, ValidateError> {
        let (repo, config) = (self.repo, self.config);
        if !entry.is_regular() {
            out.push(Violation::new(
                Some(path),
                Rule::NotRegular,
                format!("{path}: memory Markdown must be a regular file"),
            ));
            return Ok(0);
        }
        let mut bytes: Option<Vec<u8>> = None;
        if let Some(formatting) = &config.formatting {
            let data = read_blob(repo, path, entry.oid, Stage::Constraints)?;
            let text = String::from_utf8_lossy(&data);
            for message in formatting_errors(path, &text, formatting) {
                out.push(Violation::new(Some(path), Rule::Formatting, message));
            }
            bytes = Some(data);
        }
        let depth = path.matches('/').count() as u64;
        if let Some(max) = config.max_depth
            && depth > max
        {
            out.push(Violation::new(
                Some(path),
                Rule::Depth,
                format!("{path}: depth {depth} exceeds maxDepth {max}"),
            ));
        }
        let (limit, source) = match self.overrides.iter().find(|(g, _)| g.is_match(path)) {
            Some((g, max)) => (*max, format!("glob '{}'", g.as_str())),
            None => (config.max_file_characters, "maxFileCharacters".to_string()),
        };
        let count_core =
            self.root_marker && !path.contains('/') && config.max_core_memory_characters.is_some();
        if limit.is_none() && !count_core {
            return Ok(0);
        }
        let characters = match &bytes {
            Some(b) => count_code_points(b),
            None => count_code_points(&read_blob(repo, path, entry.oid, Stage::Constraints)?),
        };
        if let Some(limit) = limit
            && characters > limit
        {
            out.push(Violation::new(
                Some(path),
                Rule::FileCharacters,
                format!("{path}: {characters} characters exceeds {limit} from {source}"),
            ));
        }
        Ok(if count_core { characters } else { 0 })
    }
}

/// The outermost directory of `path` lacking `<dir>/MEMORY.md`, if any:
/// only the first per file is reported.
pub(crate) fn first_missing_index(path: &str, has: &impl Fn(&str) -> bool) -> Option<String> {
    let mut end = 0;
    while let Some(i) = path[end..].find('/') {
        let dir = &path[..end + i];
        let index = format!("{dir}/MEMORY.md");
        if !has(&index) {
            return Some(index);
        }
        end += i + 1;
    }
    None
}

/// Unicode code points as a WHATWG UTF-8 decoder (JavaScript's
/// `TextDecoder`) yields them: a BOM counts, and each maximal invalid byte
/// sequence counts as one U+FFFD.
pub fn count_code_points(bytes: &[u8]) -> u64 {
    bytes
        .utf8_chunks()
        .map(|c| c.valid().chars().count() as u64 + u64::from(!c.invalid().is_empty()))
        .sum()
}

/// Opt-in formatting rules; messages are full lines.
fn formatting_errors(path: &str, content: &str, f: &super::config::Formatting) -> Vec<String> {
    let mut out = Vec::new();
    if f.line_endings_lf && content.contains('\r') {
        out.push(format!("{path}: formatting requires LF line endings"));
    }
    if f.final_newline && !content.is_empty() && !content.ends_with('\n') {
        out.push(format!("{path}: formatting requires a final newline"));
    }
    if f.trailing_whitespace {
        let normalized = content.replace("\r\n", "\n");
        let mut fence = String::new();
        for (index, line) in normalized.split('\n').enumerate() {
            let prose = strip_blockquotes(line);
            if let Some((marker, rest)) = fence_marker(prose) {
                let closes = fence.is_empty()
                    || (marker.starts_with(&fence[..1])
                        && marker.len() >= fence.len()
                        && js_trim(rest).is_empty());
                if closes {
                    fence = if fence.is_empty() {
                        marker.to_string()
                    } else {
                        String::new()
                    };
                    continue;
                }
            }
            // Whitespace in code is content.
            if !fence.is_empty() || prose.starts_with("    ") || prose.starts_with('\t') {
                continue;
            }
            let trimmed_len = prose.trim_end_matches([' ', '\t']).len();
            let trailing = &prose[trimmed_len..];
            // Exactly two spaces after text is a Markdown hard break.
            let hard_break = trailing == "  " && !js_trim(prose).is_empty();
            if !trailing.is_empty() && !hard_break {
                out.push(format!(
                    "{path}:{}: formatting disallows trailing whitespace",
                    index + 1
                ));
            }
        }
    }
    out
}

/// Remove leading `(?: {0,3}> ?)+` blockquote markers.
fn strip_blockquotes(mut line: &str) -> &str {
    loop {
        let spaces = line.len() - line.trim_start_matches(' ').len();
        if spaces > 3 || line.as_bytes().get(spaces) != Some(&b'>') {
            return line;
        }
        line = &line[spaces + 1..];
        line = line.strip_prefix(' ').unwrap_or(line);
    }
}

/// `^ {0,3}(`{3,}|~{3,})(.*)$`: the fence run and what follows it. Like a
/// JavaScript `.`, the rest may not contain a line terminator.
fn fence_marker(line: &str) -> Option<(&str, &str)> {
    let spaces = line.len() - line.trim_start_matches(' ').len();
    if spaces > 3 {
        return None;
    }
    let body = &line[spaces..];
    let ch = body.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let run = body.len() - body.trim_start_matches(ch).len();
    if run < 3 {
        return None;
    }
    let rest = &body[run..];
    if rest.contains(['\n', '\r', '\u{2028}', '\u{2029}']) {
        return None;
    }
    Some((&body[..run], rest))
}

/// JavaScript `String.prototype.trim` (Unicode whitespace plus BOM).
fn js_trim(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || c == '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memfs::validate::config::Formatting;

    #[test]
    fn code_points() {
        assert_eq!(count_code_points("a😀".as_bytes()), 2);
        assert_eq!(count_code_points("\u{feff}x".as_bytes()), 2);
        assert_eq!(count_code_points(&[b'a', 0xff, 0xfe, b'b']), 4);
        assert_eq!(count_code_points(&[0xe2, 0x82]), 1);
    }

    #[test]
    fn first_missing_index_is_outermost() {
        let has = |p: &str| p == "a/MEMORY.md";
        assert_eq!(
            first_missing_index("a/b/c/d.md", &has),
            Some("a/b/MEMORY.md".to_string())
        );
        assert_eq!(first_missing_index("x.md", &has), None);
    }

    #[test]
    fn trailing_whitespace_rules() {
        let f = Formatting {
            line_endings_lf: true,
            final_newline: true,
            trailing_whitespace: true,
        };
        let text = "ok  \nbad \n```\ncode   \n```\n    indented  \n> quote \n\t\n  \nend";
        assert_eq!(
            formatting_errors("p.md", text, &f),
            vec![
                "p.md: formatting requires a final newline".to_string(),
                "p.md:2: formatting disallows trailing whitespace".to_string(),
                "p.md:7: formatting disallows trailing whitespace".to_string(),
                "p.md:9: formatting disallows trailing whitespace".to_string(),
            ]
        );
    }
}
