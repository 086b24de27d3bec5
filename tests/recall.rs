//! Recall (issue 16, spec agent-loop.md §6): ranked search over an agent's
//! conversations through its persistent index, from the CLI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::{create_agent, open_home, run, stderr, stdout};
use mini_letta::paths::Home;
use mini_letta::protocol::messages::{Part, Role};
use mini_letta::store::conversation::{Conversation, StoredMessage};
use serde_json::Value;

/// Append a message to conversation `conv` of agent `id`, written at `ts`.
fn put(h: &Path, id: &str, conv: &str, role: Role, text: &str, ts: &str) -> String {
    let agent = Home::at(h).agent(id).unwrap();
    let mut c = Conversation::open(&agent, conv).unwrap();
    let mid = c.next_id();
    let mut m = StoredMessage::new(mid.clone(), role, vec![Part::Text { text: text.into() }]);
    m.ts = ts.into();
    c.append(m).unwrap();
    mid
}

fn search(h: &Path, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["recall", "search", "--json"];
    all.extend_from_slice(args);
    let o = run(h, &all);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice::<Value>(&o.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn ids(hits: &[Value]) -> Vec<String> {
    hits.iter()
        .map(|v| {
            format!(
                "{}/{}",
                v["conversation_id"].as_str().unwrap(),
                v["message_id"].as_str().unwrap()
            )
        })
        .collect()
}

fn setup() -> (tempfile::TempDir, String) {
    let home = open_home();
    let id = create_agent(home.path(), &["owl"]);
    (home, id)
}

#[test]
fn english_and_chinese_without_spaces() {
    let (home, id) = setup();
    let h = home.path();
    let t = "2026-01-05T10:00:00Z";
    let a = put(
        h,
        &id,
        "default",
        Role::User,
        "I like Green Tea in the morning.",
        t,
    );
    let b = put(
        h,
        &id,
        "default",
        Role::Assistant,
        "我最喜欢喝绿茶，尤其是早上。",
        t,
    );
    put(
        h,
        &id,
        "default",
        Role::User,
        "Coffee is fine too. 咖啡也不错。",
        t,
    );
    let hits = search(h, &["green"]);
    assert_eq!(ids(&hits), [format!("default/{a}")]);
    assert_eq!(hits[0]["role"], "user");
    assert_eq!(hits[0]["created_at"], t);
    assert!(hits[0]["snippet"].as_str().unwrap().contains("Green Tea"));
    assert!(hits[0]["score"].as_f64().unwrap() > 0.0);
    assert_eq!(hits[0]["evicted"], false);
    // Chinese: no spaces needed; a bigram ranks the right message first.
    let hits = search(h, &["绿茶"]);
    assert_eq!(ids(&hits), [format!("default/{b}")]);
    assert!(hits[0]["snippet"].as_str().unwrap().contains("绿茶"));
    let hits = search(h, &["喜欢绿茶早上"]);
    assert_eq!(ids(&hits)[0], format!("default/{b}"));
    // Full-width letters fold to the same token.
    assert_eq!(ids(&search(h, &["ＧＲＥＥＮ"])), [format!("default/{a}")]);
    // The plain output names the hit.
    let o = run(h, &["recall", "search", "咖啡"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("咖啡也不错"), "{}", stdout(&o));
    let o = run(h, &["recall", "search", "nowhere"]);
    assert!(stdout(&o).contains("No messages match"), "{}", stdout(&o));
}

#[test]
fn phrases_must_occur_and_an_unclosed_quote_is_plain_terms() {
    let (home, id) = setup();
    let h = home.path();
    let t = "2026-01-05T10:00:00Z";
    let a = put(h, &id, "default", Role::User, "the green tea is cold", t);
    let b = put(h, &id, "default", Role::User, "tea that is green", t);
    let c = put(h, &id, "default", Role::User, "evergreen tea leaves", t);
    let hits = search(h, &["\"green tea\""]);
    assert_eq!(ids(&hits), [format!("default/{a}")]);
    // An unclosed quote: plain words, so every message with them.
    let hits = search(h, &["\"green tea"]);
    let got = ids(&hits);
    assert!(got.contains(&format!("default/{a}")) && got.contains(&format!("default/{b}")));
    assert!(got.contains(&format!("default/{c}")), "{got:?}");
    // A CJK phrase matches raw.
    let d = put(h, &id, "default", Role::User, "今天喝了绿茶", t);
    put(h, &id, "default", Role::User, "绿色的茶", t);
    assert_eq!(ids(&search(h, &["\"绿茶\""])), [format!("default/{d}")]);
}

#[test]
fn shorter_message_ranks_higher_across_conversations_and_ties_go_newer() {
    let (home, id) = setup();
    let h = home.path();
    let long = put(
        h,
        &id,
        "alpha",
        Role::User,
        "the kettle boiled while we talked about many unrelated things for a long while",
        "2026-01-05T10:00:00Z",
    );
    let short = put(
        h,
        &id,
        "beta",
        Role::User,
        "the kettle boiled",
        "2026-01-01T10:00:00Z",
    );
    let hits = search(h, &["kettle"]);
    assert_eq!(
        ids(&hits),
        [format!("beta/{short}"), format!("alpha/{long}")]
    );
    assert!(hits[0]["score"].as_f64().unwrap() > hits[1]["score"].as_f64().unwrap());
    // Equal text: the newer first.
    let old = put(
        h,
        &id,
        "alpha",
        Role::User,
        "same words",
        "2026-01-01T00:00:00Z",
    );
    let new = put(
        h,
        &id,
        "beta",
        Role::User,
        "same words",
        "2026-02-01T00:00:00Z",
    );
    assert_eq!(
        ids(&search(h, &["same", "words"])),
        [format!("beta/{new}"), format!("alpha/{old}")]
    );
    // Conversation and role filters.
    assert_eq!(
        ids(&search(h, &["--conversation", "alpha", "kettle"])),
        [format!("alpha/{long}")]
    );
    assert!(search(h, &["--role", "assistant", "kettle"]).is_empty());
    assert!(search(h, &["--conversation", "nope", "kettle"]).is_empty());
}

#[test]
fn date_filters_are_inclusive() {
    let (home, id) = setup();
    let h = home.path();
    let jan = put(
        h,
        &id,
        "default",
        Role::User,
        "invoice sent",
        "2026-01-31T23:00:00Z",
    );
    let feb = put(
        h,
        &id,
        "default",
        Role::User,
        "invoice paid",
        "2026-02-01T08:00:00Z",
    );
    let mar = put(
        h,
        &id,
        "default",
        Role::User,
        "invoice archived",
        "2026-03-01T08:00:00Z",
    );
    let got = |args: &[&str]| {
        let mut v = ids(&search(h, args));
        v.sort();
        v
    };
    let d = |m: &str| format!("default/{m}");
    assert_eq!(
        got(&["--since", "2026-02-01", "invoice"]),
        [d(&feb), d(&mar)]
    );
    assert_eq!(got(&["--until", "2026-01-31", "invoice"]), [d(&jan)]);
    assert_eq!(
        got(&["--since", "2026-01-31", "--until", "2026-02-01", "invoice"]),
        [d(&jan), d(&feb)]
    );
    let o = run(h, &["recall", "search", "--since", "last week", "invoice"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a date"), "{}", stderr(&o));
}

#[test]
fn evicted_when_out_of_the_context() {
    let (home, id) = setup();
    let h = home.path();
    let t = "2026-01-05T10:00:00Z";
    let a = put(h, &id, "default", Role::User, "remember the blue door", t);
    let b = put(h, &id, "default", Role::User, "the blue car", t);
    let agent = Home::at(h).agent(&id).unwrap();
    let c = Conversation::open(&agent, "default").unwrap();
    c.set_context_ids(std::slice::from_ref(&b)).unwrap();
    let hits = search(h, &["blue"]);
    let evicted: Vec<(String, bool)> = hits
        .iter()
        .map(|v| {
            (
                v["message_id"].as_str().unwrap().to_string(),
                v["evicted"].as_bool().unwrap(),
            )
        })
        .collect();
    assert!(evicted.contains(&(a.clone(), true)), "{evicted:?}");
    assert!(evicted.contains(&(b, false)), "{evicted:?}");
    let o = run(h, &["recall", "search", "door"]);
    assert!(stdout(&o).contains("(evicted)"), "{}", stdout(&o));
}

#[test]
fn index_follows_appends_and_is_rebuilt_when_deleted_or_torn() {
    let (home, id) = setup();
    let h = home.path();
    let t = "2026-01-05T10:00:00Z";
    let a = put(h, &id, "default", Role::User, "first lighthouse", t);
    assert_eq!(ids(&search(h, &["lighthouse"])).len(), 1);
    let recall = Home::at(h).agent(&id).unwrap().recall_dir();
    let docs = recall.join(mini_letta::paths::RECALL_DOCS_FILE_NAME);
    let len1 = std::fs::metadata(&docs).unwrap().len();
    assert!(len1 > 8);
    // Appends are indexed incrementally: the log grows, its start stays.
    let b = put(h, &id, "other", Role::User, "second lighthouse", t);
    let before = std::fs::read(&docs).unwrap();
    assert_eq!(ids(&search(h, &["lighthouse"])).len(), 2);
    let after = std::fs::read(&docs).unwrap();
    assert!(after.len() > before.len() && after.starts_with(&before));
    let full = after.len() as u64;

    // Deleted: rebuilt on the next search.
    std::fs::remove_dir_all(&recall).unwrap();
    let mut got = ids(&search(h, &["lighthouse"]));
    got.sort();
    assert_eq!(got, [format!("default/{a}"), format!("other/{b}")]);
    assert!(docs.exists());

    // Its last record torn: cut off, what it covered indexed again.
    let len = std::fs::metadata(&docs).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&docs).unwrap();
    f.set_len(len - 3).unwrap();
    drop(f);
    let mut got = ids(&search(h, &["lighthouse"]));
    got.sort();
    assert_eq!(got, [format!("default/{a}"), format!("other/{b}")]);
    assert_eq!(std::fs::metadata(&docs).unwrap().len(), len);
    // A corrupt byte in the middle of the last record: the same.
    let mut bytes = std::fs::read(&docs).unwrap();
    let n = bytes.len();
    bytes[n - 2] ^= 0xff;
    std::fs::write(&docs, &bytes).unwrap();
    assert_eq!(ids(&search(h, &["lighthouse"])).len(), 2);
    assert_eq!(std::fs::metadata(&docs).unwrap().len(), len);
    let _ = full;

    // A log rewritten shorter than indexed: the index is stale, rebuilt.
    let conv = Home::at(h)
        .agent(&id)
        .unwrap()
        .conversation("other")
        .unwrap();
    std::fs::write(conv.messages_jsonl(), b"").unwrap();
    assert_eq!(ids(&search(h, &["lighthouse"])), [format!("default/{a}")]);

    // reindex forces it.
    let o = run(h, &["recall", "reindex"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("indexed 1 messages"), "{}", stdout(&o));
    // The index is not a conversation.
    let o = run(h, &["conversations", "--json"]);
    assert!(!stdout(&o).contains(".recall"), "{}", stdout(&o));
}

#[test]
fn a_real_conversation_after_compaction_shows_evicted() {
    if !common::confinement_or_skip("a_real_conversation_after_compaction_shows_evicted") {
        return;
    }
    let (home, _) = setup();
    let h = home.path();
    for text in ["hello", "quasar one", "quasar two"] {
        let o = run(h, &["chat", "-p", text]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let hits = search(h, &["quasar"]);
    assert_eq!(hits.len(), 4, "{hits:?}"); // two questions, two echoes
    assert!(hits.iter().all(|v| v["evicted"] == false));
    let o = run(h, &["compact", "--mode", "all"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The questions left the context; the summary holding them is in it.
    let hits = search(h, &["--role", "user", "quasar"]);
    let (summary, asked): (Vec<&Value>, Vec<&Value>) =
        hits.iter().partition(|v| v["kind"] == "summary");
    assert_eq!(asked.len(), 2, "{hits:?}");
    assert!(asked.iter().all(|v| v["evicted"] == true), "{hits:?}");
    assert_eq!(summary.len(), 1, "{hits:?}");
    assert_eq!(summary[0]["evicted"], false);
    let hits = search(h, &["mock", "hello"]);
    assert_eq!(hits[0]["role"], "assistant");
}

#[test]
fn the_agents_recall_search_tool_uses_the_index_inside_its_confinement() {
    if !common::confinement_or_skip(
        "the_agents_recall_search_tool_uses_the_index_inside_its_confinement",
    ) {
        return;
    }
    let (home, id) = setup();
    let h = home.path();
    let old = put(
        h,
        &id,
        "old",
        Role::User,
        "the launch code is zebra-42",
        "2026-01-05T10:00:00Z",
    );
    // The operator's search makes the index first (given to the agent).
    assert_eq!(search(h, &["zebra"]).len(), 1);
    let script = h.join("script.json");
    std::fs::write(
        &script,
        serde_json::json!({"turns": [
            {"tool_calls": [{"name": "recall_search", "arguments": {"query": "zebra launch"}}]},
            {"text": "found it"}
        ]})
        .to_string(),
    )
    .unwrap();
    let o = std::process::Command::new(common::bin())
        .env("MINI_LETTA_HOME", h)
        .env("MINI_LETTA_SCRIPTED_MODEL", &script)
        .args([
            "chat",
            "-p",
            "what was the code?",
            "--model",
            "mock/scripted",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let log = std::fs::read_to_string(
        Home::at(h)
            .agent(&id)
            .unwrap()
            .conversation("default")
            .unwrap()
            .messages_jsonl(),
    )
    .unwrap();
    let result = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|m| m["role"] == "tool")
        .expect("a tool result");
    let text = result["parts"][0]["text"].as_str().unwrap();
    assert!(result["parts"][0]["is_error"] == false, "{text}");
    assert!(text.contains(&format!("[old {old} user")), "{text}");
    assert!(text.contains("zebra-42"), "{text}");
    // The child caught the index up with its own conversation; the
    // operator's next search finds both.
    let convs: Vec<String> = search(h, &["zebra"])
        .iter()
        .map(|v| v["conversation_id"].as_str().unwrap().to_string())
        .collect();
    assert!(convs.contains(&"default".to_string()), "{convs:?}");
    assert!(convs.contains(&"old".to_string()), "{convs:?}");
}

#[test]
fn export_leaves_the_index_out_and_an_import_searches_again() {
    let (home, id) = setup();
    let h = home.path();
    let m = put(
        h,
        &id,
        "default",
        Role::User,
        "pack the telescope",
        "2026-01-05T10:00:00Z",
    );
    assert_eq!(search(h, &["telescope"]).len(), 1);
    let out = h.join("owl.tar.gz");
    let o = run(
        h,
        &["agent", "export", "owl", "--output", out.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(&out).unwrap());
    let names: Vec<String> = tar::Archive::new(gz)
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n == "conversations/default/messages.jsonl"),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.contains(".recall")), "{names:?}");
    let elsewhere = open_home();
    let o = run(
        elsewhere.path(),
        &["agent", "import", out.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        ids(&search(elsewhere.path(), &["telescope"])),
        [format!("default/{m}")]
    );
}

/// The index directory is in a directory the agent's children write: a
/// child that swaps it (or a file in it) for a symbolic link must not make
/// the operator's root CLI read or write where the link points.
#[test]
fn a_planted_symlink_never_redirects_the_operators_index() {
    let (home, id) = setup();
    let h = home.path();
    put(
        h,
        &id,
        "default",
        Role::User,
        "green tea please",
        "2026-01-01T00:00:00Z",
    );
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("sentinel"), "untouched").unwrap();
    let convs = h.join("agents").join(&id).join("conversations");
    let index = convs.join(".recall");
    let _ = std::fs::remove_dir_all(&index);
    std::os::unix::fs::symlink(outside.path(), &index).unwrap();
    let o = run(h, &["recall", "search", "--json", "tea"]);
    // Refused or served from elsewhere — never through the link.
    let mut names: Vec<String> = std::fs::read_dir(outside.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["sentinel"], "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(outside.path().join("sentinel")).unwrap(),
        "untouched"
    );
    if !o.status.success() {
        assert!(!stderr(&o).trim().is_empty(), "a refusal says why");
    }
    // A link to a file in a real index directory is refused the same way.
    std::fs::remove_file(&index).unwrap();
    assert!(run(h, &["recall", "reindex"]).status.success());
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    for entry in std::fs::read_dir(&index).unwrap() {
        let p = entry.unwrap().path();
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&victim, &p).unwrap();
    }
    let o = run(h, &["recall", "search", "--json", "tea"]);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "keep",
        "{}",
        stderr(&o)
    );
}
