//! The turn loop's behaviour from the book's chapters 7–10: memory updates
//! stored once and cut to what changed, the fallback to the last valid
//! revision, and the broken-link reminder.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{bin, confinement_or_skip, create_agent, open_home, stderr};
use serde_json::Value;

fn chat(home: &Path, text: &str, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .args(["chat", "-p", text]);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{text}: {}", stderr(&o));
    o
}

fn conversation_file(home: &Path, agent: &str, name: &str) -> String {
    std::fs::read_to_string(
        home.join("agents")
            .join(agent)
            .join("conversations/default")
            .join(name),
    )
    .unwrap()
}

/// Stored messages of the default conversation.
fn messages(home: &Path, agent: &str) -> Vec<Value> {
    conversation_file(home, agent, "messages.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn text_of(m: &Value) -> String {
    m["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the model was sent last.
fn last_request(home: &Path, agent: &str) -> Value {
    serde_json::from_str(&conversation_file(home, agent, "last-request.json")).unwrap()
}

#[test]
fn a_memory_update_is_stored_once_and_shows_only_what_changed() {
    if !confinement_or_skip("a_memory_update_is_stored_once_and_shows_only_what_changed") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["ada"]);
    chat(h, "hello", &[]);
    let o = chat(h, "记住: I prefer tabs", &[]);
    assert!(
        stderr(&o).contains("· memory changed (revision "),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("· step 2"), "{}", stderr(&o));
    chat(h, "and now?", &[]);
    chat(h, "and later?", &[]);
    let updates: Vec<Value> = messages(h, &agent)
        .into_iter()
        .filter(|m| m["kind"] == "memory_update")
        .collect();
    assert_eq!(updates.len(), 1, "one commit, one stored update");
    let update = text_of(&updates[0]);
    assert!(
        update.starts_with("<system-reminder>\n<memory_update>"),
        "{update}"
    );
    assert!(update.contains("- I prefer tabs"), "{update}");
    assert!(update.contains("<human>"), "{update}");
    // Only the file that changed: persona and the index are not repeated.
    assert!(!update.contains("<persona>"), "{update}");
    assert!(!update.contains("<memory>"), "{update}");
    assert!(
        update.contains("Only the memory files that changed"),
        "{update}"
    );
    // Later requests carry it in their history (not in a new message), so
    // none of them sees the stale memory alone.
    let req = last_request(h, &agent);
    let sent = req["messages"].to_string();
    assert_eq!(sent.matches("<memory_update>").count(), 1, "{sent}");
    assert!(sent.contains("I prefer tabs"));
    // The system prompt's bytes stayed those of the first compile.
    assert!(!req["system"].as_str().unwrap().contains("I prefer tabs"));
}

/// Commit `files` on top of HEAD directly (as an operator's tool could,
/// without the hook), so HEAD's tree can fail the validator.
fn commit_unchecked(home: &Path, agent: &str, files: &[(&str, &str)]) {
    let paths = mini_letta::paths::Home::at(home).agent(agent).unwrap();
    let repo = mini_letta::memfs::repo::open_agent(&paths).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let mut index = git2::Index::new().unwrap();
    index.read_tree(&head.tree().unwrap()).unwrap();
    for (path, text) in files {
        let oid = repo.blob(text.as_bytes()).unwrap();
        let mut entry = index.get_path(Path::new("human.md"), 0).unwrap();
        entry.id = oid;
        entry.path = path.as_bytes().to_vec();
        entry.file_size = text.len() as u32;
        index.add(&entry).unwrap();
    }
    let tree = repo.find_tree(index.write_tree_to(&repo).unwrap()).unwrap();
    let sig = git2::Signature::now("operator", "op@example.invalid").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "unchecked", &tree, &[&head])
        .unwrap();
}

#[test]
fn an_invalid_head_falls_back_to_the_last_valid_revision_and_says_so() {
    if !confinement_or_skip("an_invalid_head_falls_back_to_the_last_valid_revision_and_says_so") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["bea"]);
    chat(h, "记住: a valid fact", &[]);
    let valid_head = {
        let paths = mini_letta::paths::Home::at(h).agent(&agent).unwrap();
        let repo = mini_letta::memfs::repo::open_agent(&paths).unwrap();
        repo.head().unwrap().target().unwrap().to_string()
    };
    // A note in a directory without its MEMORY.md index fails the audit.
    commit_unchecked(
        h,
        &agent,
        &[
            (
                "human.md",
                "---\nname: Human\ndescription: What I know about the user.\n---\n- a valid fact\n- an unvalidated fact\n",
            ),
            (
                "notes/stray.md",
                "---\nname: Stray\ndescription: x\n---\nbody\n",
            ),
        ],
    );
    let o = Command::new(bin())
        .env("MINI_LETTA_HOME", h)
        .args(["chat", "-p", "what now?", "--recompile"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("memory-revision-invalid"),
        "{}",
        stderr(&o)
    );
    let req = last_request(h, &agent);
    let system = req["system"].as_str().unwrap();
    assert!(system.contains("- a valid fact"), "{system}");
    assert!(!system.contains("unvalidated"), "{system}");
    let notice = messages(h, &agent)
        .into_iter()
        .find(|m| m["kind"] == "reminder")
        .map(|m| text_of(&m))
        .expect("a stored reminder");
    assert!(notice.contains("MEMORY REVISION INVALID"), "{notice}");
    assert!(notice.contains(&valid_head[..7]), "{notice}");
    assert!(notice.contains("notes"), "names what fails: {notice}");
    let cache: Value =
        serde_json::from_str(&conversation_file(h, &agent, "system-prompt.json")).unwrap();
    assert_eq!(cache["memfsRevision"], valid_head.as_str());
}

#[test]
fn a_commit_that_leaves_an_index_link_dangling_is_reminded() {
    if !confinement_or_skip("a_commit_that_leaves_an_index_link_dangling_is_reminded") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["cyd"]);
    let index_line = "- [human](human.md) — What I know about the user.";
    let index = conversation_index(h, &agent);
    assert!(index.contains(index_line), "{index}");
    let script = h.join("script.json");
    std::fs::write(
        &script,
        serde_json::json!({"turns": [
            {"tool_calls": [{"name": "memory", "arguments": {
                "command": "str_replace", "reason": "link old notes",
                "file_path": "MEMORY.md", "old_string": index_line,
                "new_string": format!("{index_line}\n- [old notes](notes/old.md) — gone")}}]},
            {"text": "linked"},
            {"text": "ok"}
        ]})
        .to_string(),
    )
    .unwrap();
    let env = [("MINI_LETTA_SCRIPTED_MODEL", script.to_str().unwrap())];
    let scripted = |text: &str| {
        let o = Command::new(bin())
            .env("MINI_LETTA_HOME", h)
            .envs(env)
            .args(["chat", "-p", text, "--model", "mock/scripted"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        o
    };
    scripted("link the old notes");
    let o = scripted("anything else?");
    assert!(stderr(&o).contains("memory-links-broken"), "{}", stderr(&o));
    let reminder = messages(h, &agent)
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(text_of)
        .unwrap();
    assert!(reminder.contains("MEMORY LINKS BROKEN"), "{reminder}");
    assert!(
        reminder.contains("- MEMORY.md: (notes/old.md) does not exist"),
        "{reminder}"
    );
    assert!(
        !reminder.contains("human.md)"),
        "a good link is not named: {reminder}"
    );
}

/// The root index at HEAD.
fn conversation_index(home: &Path, agent: &str) -> String {
    let o = Command::new(bin())
        .env("MINI_LETTA_HOME", home)
        .args(["memory", "show", "-a", agent, "MEMORY.md"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn skills_are_offered_per_request_outside_the_cached_prompt() {
    if !confinement_or_skip("skills_are_offered_per_request_outside_the_cached_prompt") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["dee"]);
    let o = Command::new(bin())
        .env("MINI_LETTA_HOME", h)
        .args([
            "memory",
            "create",
            "skills/pdf/SKILL.md",
            "--description",
            "Read and write PDFs",
            "--body",
            "How to read PDFs.",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    chat(h, "hi", &[]);
    let system = last_request(h, &agent)["system"]
        .as_str()
        .unwrap()
        .to_string();
    let skills_root = h.join("agents").join(&agent).join("memory/skills");
    let block = format!(
        "\n\n<available_skills>\n{}\n└── pdf/\n    └── SKILL.md (Read and write PDFs)\n</available_skills>",
        skills_root.display()
    );
    assert!(system.ends_with(&block), "{system}");
    let cache: Value =
        serde_json::from_str(&conversation_file(h, &agent, "system-prompt.json")).unwrap();
    assert!(
        !cache["content"]
            .as_str()
            .unwrap()
            .contains("available_skills"),
        "the block is per request, not cached"
    );
}
