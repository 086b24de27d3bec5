//! Skills: `skills/<name>/SKILL.md` directories in the agent's memory
//! working tree, offered to the model as an `<available_skills>` block
//! appended to each request's system prompt (spec compiler.md §10). The
//! block is per request, never part of the cached prompt, so adding a
//! skill does not break the provider's prompt cache prefix.

use std::path::{Path, PathBuf};

use crate::memfs::collate::locale_compare;
use crate::memfs::frontmatter::{FrontmatterValue, parse_frontmatter};

/// Most skills listed, directories walked deep, and bytes read per file:
/// the working tree is the agent's to fill.
const MAX_SKILLS: usize = 256;
const MAX_DEPTH: usize = 8;
const MAX_SKILL_BYTES: u64 = 64 << 10;

/// One skill as the block shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    /// The directory path relative to the skills root (`pdf`, `web/scraper`).
    pub name: String,
    pub description: String,
    /// Where its `SKILL.md` is.
    pub location: String,
}

/// The skills under `<memory_dir>/skills/`, in discovery order (names
/// sorted), read from the working tree; symbolic links are not followed.
pub(crate) fn discover(memory_dir: &Path) -> Vec<Skill> {
    let root = memory_dir.join("skills");
    let mut found = Vec::new();
    walk(&root, &root, 0, &mut found);
    found.sort_by(|a, b| locale_compare(&a.name, &b.name));
    found
}

fn walk(root: &Path, dir: &Path, depth: usize, found: &mut Vec<Skill>) {
    if depth > MAX_DEPTH || found.len() >= MAX_SKILLS {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if kind.is_dir() {
            walk(root, &path, depth + 1, found);
        } else if kind.is_file()
            && entry
                .file_name()
                .to_string_lossy()
                .eq_ignore_ascii_case("SKILL.md")
            && let Some(skill) = read_skill(root, &path)
        {
            found.push(skill);
        }
        if found.len() >= MAX_SKILLS {
            return;
        }
    }
}

fn read_skill(root: &Path, file: &Path) -> Option<Skill> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .ok()?
        .take(MAX_SKILL_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let parsed = parse_frontmatter(&text);
    let dir = file.parent()?.strip_prefix(root).ok()?;
    let name = dir.to_string_lossy().replace('\\', "/");
    let name = if name.is_empty() {
        "root".to_string()
    } else {
        name
    };
    let text_field = |k: &str| match parsed.fields.get(k) {
        Some(FrontmatterValue::Text(t)) if !t.trim().is_empty() => Some(unquote(t.trim())),
        _ => None,
    };
    let description = text_field("description").unwrap_or_else(|| {
        let body = parsed.body.trim();
        body.split("\n\n").next().unwrap_or("").to_string()
    });
    let description = match text_field("when_to_use") {
        Some(w) => format!("{}\n\nWhen to use: {w}", description.trim()),
        None => description.trim().to_string(),
    };
    Some(Skill {
        name,
        description,
        location: PathBuf::from(file).display().to_string(),
    })
}

fn unquote(s: &str) -> String {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner.to_string();
        }
    }
    s.to_string()
}

/// Where a skill's tree starts and its path below that root: a
/// `…/<dir>/SKILL.md` whose directory is named like the skill's last name
/// segment hangs under the directory's parent, anything else under its own
/// directory.
fn root_and_relative(name: &str, location: &str) -> (String, String) {
    let normalized = location.trim().replace('\\', "/");
    let (dir, base) = match normalized.rsplit_once('/') {
        Some((d, b)) => (d.to_string(), b.to_string()),
        None => (String::new(), normalized.clone()),
    };
    if normalized.ends_with("/SKILL.md") {
        let (parent, dir_name) = dir.rsplit_once('/').unwrap_or(("", dir.as_str()));
        if Some(dir_name) == name.rsplit('/').next() {
            return (parent.to_string(), format!("{dir_name}/{base}"));
        }
    }
    (dir, base)
}

enum Node {
    Dir(Vec<(String, Node)>),
    Leaf(String),
}

fn insert(children: &mut Vec<(String, Node)>, parts: &[&str], description: &str) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    if rest.is_empty() {
        match children.iter_mut().find(|(n, _)| n == first) {
            Some((_, node)) => *node = Node::Leaf(description.to_string()),
            None => children.push((first.to_string(), Node::Leaf(description.to_string()))),
        }
        return;
    }
    let pos = match children
        .iter()
        .position(|(n, c)| n == first && matches!(c, Node::Dir(_)))
    {
        Some(p) => p,
        None => {
            children.retain(|(n, _)| n != first);
            children.push((first.to_string(), Node::Dir(Vec::new())));
            children.len() - 1
        }
    };
    if let Node::Dir(sub) = &mut children[pos].1 {
        insert(sub, rest, description);
    }
}

fn render(children: &mut [(String, Node)], prefix: &str, lines: &mut Vec<String>) {
    children.sort_by(|(a, an), (b, bn)| match (an, bn) {
        (Node::Dir(_), Node::Leaf(_)) => std::cmp::Ordering::Less,
        (Node::Leaf(_), Node::Dir(_)) => std::cmp::Ordering::Greater,
        _ => locale_compare(a, b),
    });
    let count = children.len();
    for (i, (name, node)) in children.iter_mut().enumerate() {
        let last = i + 1 == count;
        let connector = if last { "└── " } else { "├── " };
        match node {
            Node::Dir(sub) => {
                lines.push(format!("{prefix}{connector}{name}/"));
                let deeper = format!("{prefix}{}", if last { "    " } else { "│   " });
                render(sub, &deeper, lines);
            }
            Node::Leaf(description) => {
                let d = description.trim();
                if d.is_empty() {
                    lines.push(format!("{prefix}{connector}{name}"));
                } else {
                    lines.push(format!("{prefix}{connector}{name} ({d})"));
                }
            }
        }
    }
}

/// The `<available_skills>` block, or `""` when there are none. Repeated
/// names keep their first entry; a description shows its first line.
pub(crate) fn available_skills_block(skills: &[Skill]) -> String {
    let mut seen = std::collections::HashSet::new();
    let mut groups: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for s in skills {
        if s.name.is_empty() || !seen.insert(s.name.as_str()) {
            continue;
        }
        let description = s
            .description
            .trim()
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        let (root, rel) = root_and_relative(&s.name, &s.location);
        match groups.iter_mut().find(|(r, _)| *r == root) {
            Some((_, g)) => g.push((rel, description)),
            None => groups.push((root, vec![(rel, description)])),
        }
    }
    if groups.is_empty() {
        return String::new();
    }
    groups.sort_by(|(a, _), (b, _)| locale_compare(a, b));
    let mut lines = vec!["<available_skills>".to_string()];
    let n = groups.len();
    for (i, (root, mut entries)) in groups.into_iter().enumerate() {
        lines.push(root);
        entries.sort_by(|(a, _), (b, _)| locale_compare(a, b));
        let mut tree = Vec::new();
        for (rel, description) in &entries {
            let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
            insert(&mut tree, &parts, description);
        }
        render(&mut tree, "", &mut lines);
        if i + 1 != n {
            lines.push(String::new());
        }
    }
    lines.push("</available_skills>".to_string());
    lines.join("\n")
}

/// `system` with the block appended (`\n\n` after the prompt right-trimmed);
/// unchanged when there are no skills.
pub(crate) fn append_block(system: &str, skills: &[Skill]) -> String {
    let block = available_skills_block(skills);
    if block.is_empty() {
        return system.to_string();
    }
    format!("{}\n\n{}", system.trim_end(), block.trim_start())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill(name: &str, description: &str, location: &str) -> Skill {
        Skill {
            name: name.into(),
            description: description.into(),
            location: location.into(),
        }
    }

    #[test]
    fn the_block_groups_by_root_and_draws_a_tree() {
        let block = available_skills_block(&[
            skill(
                "pdf",
                "Read and write PDFs\nLonger details are omitted",
                "/repo/skills/pdf/SKILL.md",
            ),
            skill(
                "linear-cli",
                "Manage Linear issues",
                "/home/user/.letta/skills/linear-cli/SKILL.md",
            ),
            skill("pdf", "a repeat is dropped", "/elsewhere/pdf/SKILL.md"),
            skill("notes", "", "/repo/skills/notes/SKILL.md"),
        ]);
        assert_eq!(
            block,
            "<available_skills>\n\
             /home/user/.letta/skills\n\
             └── linear-cli/\n    └── SKILL.md (Manage Linear issues)\n\
             \n\
             /repo/skills\n\
             ├── notes/\n│   └── SKILL.md\n\
             └── pdf/\n    └── SKILL.md (Read and write PDFs)\n\
             </available_skills>"
        );
        assert_eq!(append_block("compiled\n\n", &[]), "compiled\n\n");
        assert!(
            append_block("compiled\n", &[skill("pdf", "x", "/r/pdf/SKILL.md")])
                .starts_with("compiled\n\n<available_skills>\n/r\n└── pdf/")
        );
    }

    #[test]
    fn a_skill_outside_a_matching_directory_hangs_under_its_own() {
        assert_eq!(
            root_and_relative("web/scraper", "/m/skills/web/scraper/SKILL.md"),
            ("/m/skills/web".to_string(), "scraper/SKILL.md".to_string())
        );
        assert_eq!(
            root_and_relative("odd", "/m/skills/other/SKILL.md"),
            ("/m/skills/other".to_string(), "SKILL.md".to_string())
        );
    }

    #[test]
    fn discovery_reads_descriptions_from_frontmatter_or_the_first_paragraph() {
        let dir = tempfile::tempdir().unwrap();
        let skills = dir.path().join("skills");
        std::fs::create_dir_all(skills.join("pdf")).unwrap();
        std::fs::create_dir_all(skills.join("web/scraper")).unwrap();
        std::fs::write(
            skills.join("pdf/SKILL.md"),
            "---\nname: pdf\ndescription: \"Read PDFs\"\nwhen_to_use: a PDF is attached\n---\nBody.\n",
        )
        .unwrap();
        std::fs::write(
            skills.join("web/scraper/skill.md"),
            "Scrape pages politely.\nSecond line.\n\nMore.\n",
        )
        .unwrap();
        std::fs::write(skills.join("README.md"), "not a skill").unwrap();
        let found = discover(dir.path());
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].name, "pdf");
        assert_eq!(
            found[0].description,
            "Read PDFs\n\nWhen to use: a PDF is attached"
        );
        assert_eq!(found[1].name, "web/scraper");
        assert_eq!(found[1].description, "Scrape pages politely.\nSecond line.");
        let block = available_skills_block(&found);
        assert!(
            block.contains("└── pdf/\n    └── SKILL.md (Read PDFs)"),
            "{block}"
        );
        // Only `SKILL.md` spelled so hangs under its parent directory.
        assert!(
            block.contains("skills/web/scraper\n└── skill.md (Scrape pages politely.)"),
            "{block}"
        );
    }
}
