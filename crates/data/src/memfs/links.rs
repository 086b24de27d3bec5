//! Links in the memory indexes (`MEMORY.md` files) that lead nowhere.
//!
//! A dangling link does not make memory wrong, only harder to find, so it
//! is reported (a reminder to the agent after the commit that left it, a
//! line in `doctor`) rather than refused by the commit hook, which would
//! block every commit of the tree until it is fixed (book ch. 10 ex. 2).

use std::collections::HashSet;

use git2::Repository;

use super::repo::RepoError;
use super::snapshot::read_head;

/// A link target an index names that HEAD does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenLink {
    /// The index holding the link (`MEMORY.md`, `projects/MEMORY.md`).
    pub index: String,
    /// The target as written in the link.
    pub target: String,
}

/// The relative link targets of Markdown text: `](target)`, without a
/// `#fragment` or a `"title"`; URLs, anchors and absolute paths are not
/// memory paths and are skipped.
pub(crate) fn relative_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let raw = rest[..end].trim();
        rest = &rest[end..];
        // `<a path with spaces>`, else up to the first space (a title follows).
        let target = match raw.strip_prefix('<') {
            Some(inner) => inner.split('>').next().unwrap_or(""),
            None => raw.split_whitespace().next().unwrap_or(""),
        };
        let target = target.split('#').next().unwrap_or("");
        if target.is_empty()
            || target.starts_with('/')
            || target.contains("://")
            || target.starts_with("mailto:")
        {
            continue;
        }
        out.push(target.to_string());
    }
    out
}

/// Resolve `target` against the directory of `index` (`.` and `..`
/// segments applied); `None` when it climbs out of the repository.
fn resolve(index: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = index.split('/').collect();
    parts.pop();
    for seg in target.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}

/// Every link of every `MEMORY.md` at HEAD whose target is neither a file
/// nor a directory of HEAD's tree.
pub fn broken_index_links(repo: &Repository) -> Result<Vec<BrokenLink>, RepoError> {
    let Some(head) = read_head(repo)? else {
        return Ok(Vec::new());
    };
    let blobs = head.all_blobs()?;
    let files: HashSet<&str> = blobs.iter().map(|e| e.path.as_str()).collect();
    let dirs: HashSet<String> = blobs
        .iter()
        .flat_map(|e| {
            let parts: Vec<&str> = e.path.split('/').collect();
            (1..parts.len()).map(move |n| parts[..n].join("/"))
        })
        .collect();
    let mut broken = Vec::new();
    for entry in blobs
        .iter()
        .filter(|e| e.path == "MEMORY.md" || e.path.ends_with("/MEMORY.md"))
    {
        let text = head.read_text(entry)?;
        for target in relative_targets(&text) {
            let found = resolve(&entry.path, &target).is_some_and(|p| {
                let p = p.trim_end_matches('/');
                files.contains(p) || dirs.contains(p)
            });
            if !found {
                broken.push(BrokenLink {
                    index: entry.path.clone(),
                    target,
                });
            }
        }
    }
    Ok(broken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_skip_urls_anchors_and_absolute_paths() {
        let text = "- [a](a.md) — x\n- [b](notes/b.md#part \"title\")\n- [w](https://x.org/y)\n\
                    - [h](#here)\n- [r](/etc/passwd)\n- [d](projects/)\n- [p](<sp ace.md>)";
        assert_eq!(
            relative_targets(text),
            vec!["a.md", "notes/b.md", "projects/", "sp ace.md"]
        );
    }

    #[test]
    fn targets_resolve_against_the_index_directory() {
        assert_eq!(resolve("MEMORY.md", "a.md").as_deref(), Some("a.md"));
        assert_eq!(
            resolve("projects/MEMORY.md", "../human.md").as_deref(),
            Some("human.md")
        );
        assert_eq!(
            resolve("projects/MEMORY.md", "./x/y.md").as_deref(),
            Some("projects/x/y.md")
        );
        assert_eq!(resolve("MEMORY.md", "../../x.md"), None);
    }
}
