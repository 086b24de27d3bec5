//! What a path in a memory repository *is*: the memfs-v1 / memfs-v2 layouts and
//! the role each committed path plays in the system prompt.

use serde::Serialize;

/// The two memory layouts. v2 is chosen by a root `MEMORY.md` in HEAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MemoryFormat {
    #[serde(rename = "memfs-v1")]
    V1,
    #[serde(rename = "memfs-v2")]
    V2,
}

impl MemoryFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "memfs-v1",
            Self::V2 => "memfs-v2",
        }
    }
}

/// The root index file name.
pub const INDEX_FILE: &str = "MEMORY.md";

/// The role of one committed path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathRole {
    /// Always rendered into the system prompt.
    Core,
    /// Root `MEMORY.md` (v2): rendered as the `<memory>` block.
    RootIndex,
    /// `<dir>/MEMORY.md` (v2): first-level ones are listed as deferred memory.
    DirectoryIndex,
    /// Memory read on demand, never rendered.
    OnDemand,
    /// A nested Markdown file some ancestor of which has no `MEMORY.md` (v2):
    /// not memory at all until indexed.
    Unindexed,
    /// Under `skills/`.
    Skill,
    /// Not Markdown.
    Other,
}

impl PathRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Core => "core",
            Self::RootIndex => "root-index",
            Self::DirectoryIndex => "directory-index",
            Self::OnDemand => "on-demand",
            Self::Unindexed => "unindexed",
            Self::Skill => "skill",
            Self::Other => "other",
        }
    }
}

/// `MEMORY.md` or `…/MEMORY.md`.
pub(crate) fn is_index_path(path: &str) -> bool {
    path == INDEX_FILE || path.ends_with("/MEMORY.md")
}

/// Core memory: v2 = a root `.md` file; v1 = a `.md` file under `system/`.
pub(crate) fn is_core_path(path: &str, format: MemoryFormat) -> bool {
    path.ends_with(".md")
        && match format {
            MemoryFormat::V2 => !path.contains('/'),
            MemoryFormat::V1 => path.starts_with("system/"),
        }
}

/// `skills` itself or anything below it.
pub(crate) fn is_skill_path(path: &str) -> bool {
    path == "skills" || path.starts_with("skills/")
}

/// Whether `path` is visible memory: v1 everything; v2 root files, and nested
/// files only when every ancestor directory has its own `MEMORY.md`
/// (`has_path` answers whether a path exists in the same tree).
pub(crate) fn is_projected_path(
    path: &str,
    format: MemoryFormat,
    has_path: impl Fn(&str) -> bool,
) -> bool {
    match format {
        MemoryFormat::V1 => true,
        MemoryFormat::V2 => {
            if is_skill_path(path) {
                return false;
            }
            let mut end = 0;
            while let Some(slash) = path[end..].find('/') {
                let dir = &path[..end + slash];
                if !has_path(&format!("{dir}/{INDEX_FILE}")) {
                    return false;
                }
                end += slash + 1;
            }
            true
        }
    }
}

/// `<one segment>/MEMORY.md`, the indexes the v2 prompt lists.
pub(crate) fn is_child_index_path(path: &str) -> bool {
    path.strip_suffix("/MEMORY.md")
        .is_some_and(|dir| !dir.is_empty() && !dir.contains('/'))
}

/// The role of `path` in a tree laid out as `format`.
pub fn role_of(path: &str, format: MemoryFormat, has_path: impl Fn(&str) -> bool) -> PathRole {
    if is_skill_path(path) {
        return PathRole::Skill;
    }
    if !path.ends_with(".md") {
        return PathRole::Other;
    }
    match format {
        MemoryFormat::V1 if is_core_path(path, format) => PathRole::Core,
        MemoryFormat::V1 => PathRole::OnDemand,
        MemoryFormat::V2 => {
            if path == INDEX_FILE {
                PathRole::RootIndex
            } else if is_core_path(path, format) {
                PathRole::Core
            } else if !is_projected_path(path, format, has_path) {
                PathRole::Unindexed
            } else if is_index_path(path) {
                PathRole::DirectoryIndex
            } else {
                PathRole::OnDemand
            }
        }
    }
}

/// Label of a memory file: its path without one trailing `.md`.
pub(crate) fn label_of(path: &str) -> &str {
    path.strip_suffix(".md").unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles() {
        let paths = [
            "MEMORY.md",
            "a/MEMORY.md",
            "a/x.md",
            "b/y.md",
            "a/c/z.md",
            "skills/s/SKILL.md",
            "n.txt",
            "p.md",
        ];
        let has = |p: &str| paths.contains(&p);
        let r = |p| role_of(p, MemoryFormat::V2, has);
        assert_eq!(r("MEMORY.md"), PathRole::RootIndex);
        assert_eq!(r("p.md"), PathRole::Core);
        assert_eq!(r("a/MEMORY.md"), PathRole::DirectoryIndex);
        assert_eq!(r("a/x.md"), PathRole::OnDemand);
        assert_eq!(r("b/y.md"), PathRole::Unindexed);
        assert_eq!(r("a/c/z.md"), PathRole::Unindexed);
        assert_eq!(r("skills/s/SKILL.md"), PathRole::Skill);
        assert_eq!(r("n.txt"), PathRole::Other);
        assert_eq!(
            role_of("system/a.md", MemoryFormat::V1, has),
            PathRole::Core
        );
        assert_eq!(
            role_of("ref/a.md", MemoryFormat::V1, has),
            PathRole::OnDemand
        );
    }

    #[test]
    fn child_index() {
        assert!(is_child_index_path("projects/MEMORY.md"));
        assert!(!is_child_index_path("a/b/MEMORY.md"));
        assert!(!is_child_index_path("MEMORY.md"));
        assert!(!is_child_index_path("/MEMORY.md"));
        assert!(!is_child_index_path("projects/NOTMEMORY.md"));
    }
}
