//! Property: the compiled prompt depends only on HEAD. For random
//! repositories, compiling twice gives the same bytes, and random working-tree
//! and index changes after the commit change nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::TestRepo;
use mini_letta::memfs::compiler::{CompileOptions, compile_dir};
use proptest::prelude::*;
use time::macros::datetime;

fn opts() -> CompileOptions<'static> {
    CompileOptions {
        agent_id: "agent-p",
        conversation_id: "c",
        system: "S {CORE_MEMORY}",
        now: datetime!(2026-01-01 00:00:00 UTC),
        previous_message_count: 3,
    }
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9_-]{1,8}",
        Just("MEMORY".to_string()),
        Just("system".to_string()),
        Just("skills".to_string()),
        "[日本🦉é &]{1,3}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(segment(), 0..3),
        segment(),
        prop_oneof![Just(".md"), Just(".md"), Just(".txt")],
    )
        .prop_map(|(dirs, name, ext)| {
            let mut p = dirs.join("/");
            if !p.is_empty() {
                p.push('/');
            }
            p.push_str(&name);
            p.push_str(ext);
            p
        })
}

fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~\n]{0,40}",
        "---\nname: [a-z]{1,5}\ndescription: [ -~]{0,20}\n---\n[ -~\n\r]{0,30}",
        Just("\u{FEFF}---\r\ndescription: bom\r\n---\r\nx".to_string()),
    ]
}

#[derive(Debug, Clone)]
enum Change {
    Edit(usize, String),
    Delete(usize),
    AddUntracked(String, String),
    AddStaged(String, String),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (any::<usize>(), body()).prop_map(|(i, b)| Change::Edit(i, b)),
        any::<usize>().prop_map(Change::Delete),
        (path(), body()).prop_map(|(p, b)| Change::AddUntracked(p, b)),
        (path(), body()).prop_map(|(p, b)| Change::AddStaged(p, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn output_depends_only_on_head(
        files in prop::collection::btree_map(path(), body(), 1..12),
        with_index in any::<bool>(),
        changes in prop::collection::vec(change(), 1..6),
    ) {
        let r = TestRepo::new();
        let mut paths: Vec<String> = Vec::new();
        for (p, b) in &files {
            // A path may not be both a file and a directory.
            if paths.iter().any(|q| q.starts_with(&format!("{p}/")) || p.starts_with(&format!("{q}/"))) {
                continue;
            }
            r.write(p, b);
            paths.push(p.clone());
        }
        if with_index {
            r.write("MEMORY.md", "# Memory\n");
            paths.push("MEMORY.md".into());
        }
        r.commit_all("base");
        let first = compile_dir(r.path(), &opts()).unwrap();
        let again = compile_dir(r.path(), &opts()).unwrap();
        prop_assert_eq!(&first, &again);

        for c in changes {
            match c {
                Change::Edit(i, b) => { let p = &paths[i % paths.len()]; r.write(p, b); }
                Change::Delete(i) => {
                    let p = r.path().join(&paths[i % paths.len()]);
                    let _ = std::fs::remove_file(p);
                }
                Change::AddUntracked(p, b) | Change::AddStaged(p, b) if paths.iter().any(|q| q.starts_with(&format!("{p}/")) || p.starts_with(&format!("{q}/")) || *q == p) => { let _ = b; }
                Change::AddUntracked(p, b) => { r.write(&p, b); }
                Change::AddStaged(p, b) => { r.write(&p, b); r.stage(&p); }
            }
        }
        let after = compile_dir(r.path(), &opts()).unwrap();
        prop_assert_eq!(first, after);
    }
}
