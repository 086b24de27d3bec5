//! The memory a new agent starts with: the memfs-v2 layout of the book
//! (root `MEMORY.md` index without frontmatter, `persona.md` and `human.md`
//! with exactly `name` + `description`).

/// Message of the first commit in every memory repository.
pub const INITIAL_COMMIT_MESSAGE: &str = "chore: initialize memory";

pub const PERSONA_DESCRIPTION: &str = "Who I am and how I behave.";
pub const HUMAN_DESCRIPTION: &str = "What I know about the user.";

/// `(path, contents)` of the initial files, in commit order.
pub fn initial_files() -> Vec<(&'static str, String)> {
    vec![
        (
            "MEMORY.md",
            format!(
                "# Memory\n\n- [persona](persona.md) — {PERSONA_DESCRIPTION}\n- [human](human.md) — {HUMAN_DESCRIPTION}\n"
            ),
        ),
        (
            "persona.md",
            format!(
                "---\nname: Persona\ndescription: {PERSONA_DESCRIPTION}\n---\n\nI am mini-letta, a helpful assistant that remembers.\n"
            ),
        ),
        (
            "human.md",
            format!("---\nname: Human\ndescription: {HUMAN_DESCRIPTION}\n---\n"),
        ),
    ]
}

/// The display name derived from a label: strip `.md`, split on runs of `-`
/// or `_`, capitalise each word (`project_conventions` → `Project Conventions`).
pub fn name_from_label(label: &str) -> String {
    let base = label.rsplit('/').next().unwrap_or(label);
    let base = base.strip_suffix(".md").unwrap_or(base);
    base.split(['-', '_'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut chars = w.chars();
            match chars.next() {
                Some(first) => first.to_uppercase().chain(chars).collect::<String>(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_labels() {
        assert_eq!(
            name_from_label("project_conventions"),
            "Project Conventions"
        );
        assert_eq!(
            name_from_label("project-conventions.md"),
            "Project Conventions"
        );
        assert_eq!(name_from_label("persona"), "Persona");
        assert_eq!(name_from_label("a__b--c"), "A B C");
        assert_eq!(name_from_label("notes/deep_dive.md"), "Deep Dive");
    }
}
