//! The foundation commands through the real binary: agent create/list/show,
//! memory compile/show/tree, prompt, and their error reporting.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{TestRepo, run, stderr, stdout};
use serde_json::Value;

#[test]
fn compile_prints_exact_bytes_and_json() {
    let r = TestRepo::with_files(&[
        ("MEMORY.md", "# Memory\n"),
        ("human.md", "---\nname: H\ndescription: d\n---\nx\n"),
    ]);
    let home = tempfile::tempdir().unwrap();
    let dir = r.path().to_str().unwrap();
    let o = run(home.path(), &["memory", "compile", "--memory-dir", dir]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "<human>\n<description>d</description>\nx\n</human>\n\n<memory>\n# Memory\n</memory>"
    );

    let o = run(
        home.path(),
        &[
            "memory",
            "compile",
            "--memory-dir",
            dir,
            "--json",
            "--system",
            "S {CORE_MEMORY}",
            "--now",
            "2026-05-04T00:00:00Z",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let core = v["coreMemory"].as_str().unwrap();
    assert_eq!(v["content"].as_str().unwrap(), format!("S {core}"));
    assert_eq!(v["compiledAt"], "2026-05-04T00:00:00.000Z");
    assert_eq!(v["memoryFormat"], "memfs-v2");
    assert_eq!(v["rawSystemHash"].as_str().unwrap().len(), 64);
    let head = r
        .repo
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id()
        .to_string();
    assert_eq!(v["memfsRevision"].as_str().unwrap(), head);
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 6, "{keys:?}");
}

#[test]
fn compile_v1_metadata_from_flags() {
    let r = TestRepo::with_files(&[("system/persona.md", "P")]);
    let home = tempfile::tempdir().unwrap();
    let o = run(
        home.path(),
        &[
            "memory",
            "compile",
            "--memory-dir",
            r.path().to_str().unwrap(),
            "--agent-id",
            "agent-x",
            "--conversation-id",
            "conv-1",
            "--now",
            "2026-05-04T23:59:59.999Z",
            "--message-count",
            "7",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).ends_with(
        "<memory_metadata>\n- AGENT_ID: agent-x\n- CONVERSATION_ID: conv-1\n- System prompt last recompiled: 2026-05-04 11:59:59 PM UTC+0000\n- 7 previous messages between you and the user are stored in recall memory\n</memory_metadata>"
    ));
}

#[test]
fn compile_errors_are_one_line() {
    let home = tempfile::tempdir().unwrap();
    let plain = tempfile::tempdir().unwrap();
    for dir in [plain.path().to_path_buf(), plain.path().join("missing")] {
        let o = run(
            home.path(),
            &["memory", "compile", "--memory-dir", dir.to_str().unwrap()],
        );
        assert!(!o.status.success());
        assert!(o.stdout.is_empty());
        let err = stderr(&o);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.starts_with("mini-letta: error: "), "{err}");
    }
    let o = run(
        home.path(),
        &[
            "memory",
            "compile",
            "--memory-dir",
            plain.path().to_str().unwrap(),
            "--now",
            "yesterday",
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("RFC 3339"));
}

#[test]
fn agent_lifecycle_and_prompt() {
    let home = tempfile::tempdir().unwrap();
    let o = run(home.path(), &["agent", "list", "--json"]);
    assert!(o.status.success());
    assert_eq!(
        serde_json::from_str::<Value>(&stdout(&o)).unwrap()["agents"],
        serde_json::json!([])
    );

    let sys = home.path().join("sys.txt");
    std::fs::write(&sys, "You are Owl.\n\n{CORE_MEMORY}\n\nBe brief.").unwrap();
    let o = run(
        home.path(),
        &[
            "agent",
            "create",
            "owl",
            "--system-file",
            sys.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rec: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let id = rec["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("agent-"));
    assert_eq!(rec["model"], "mock");

    // Layout: git dir beside the working tree, linked relatively.
    let agent_dir = home.path().join("agents").join(&id);
    assert!(agent_dir.join("agent.json").is_file());
    assert!(agent_dir.join("memory.git").is_dir());
    assert_eq!(
        std::fs::read_to_string(agent_dir.join("memory/.git")).unwrap(),
        "gitdir: ../memory.git\n"
    );
    let repo = git2::Repository::open(agent_dir.join("memory")).unwrap();
    assert_eq!(repo.head().unwrap().shorthand().unwrap(), "main");
    let mut walk = repo.revwalk().unwrap();
    walk.push_head().unwrap();
    assert_eq!(walk.count(), 1, "exactly one initial commit");
    let tree = repo.head().unwrap().peel_to_tree().unwrap();
    let names: Vec<_> = tree.iter().map(|e| e.name().unwrap().to_string()).collect();
    assert_eq!(names, ["MEMORY.md", "human.md", "persona.md"]);
    for f in ["human.md", "persona.md"] {
        let text = std::fs::read_to_string(agent_dir.join("memory").join(f)).unwrap();
        assert!(text.starts_with("---\nname: "), "{text}");
        assert!(text.contains("\ndescription: "), "{text}");
    }
    assert!(
        !std::fs::read_to_string(agent_dir.join("memory/MEMORY.md"))
            .unwrap()
            .starts_with("---")
    );

    // Duplicate names are refused.
    let o = run(home.path(), &["agent", "create", "owl"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("already exists"));

    let o = run(home.path(), &["prompt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = stdout(&o);
    assert!(p.starts_with("You are Owl.\n\n<human>\n<description>What I know about the user.</description>\n</human>"), "{p}");
    assert!(p.ends_with("</memory>\n\nBe brief."), "{p}");
    let fresh = run(home.path(), &["prompt", "-a", "owl", "--fresh"]);
    assert_eq!(stdout(&fresh), p, "v2 prompts do not depend on time");

    let o = run(home.path(), &["agent", "show", "owl", "--json"]);
    assert_eq!(
        serde_json::from_str::<Value>(&stdout(&o)).unwrap()["id"],
        id.as_str()
    );

    // A second agent makes the selector mandatory.
    assert!(
        run(home.path(), &["agent", "create", "two"])
            .status
            .success()
    );
    let o = run(home.path(), &["prompt"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("choose one with -a"));
    let o = run(home.path(), &["agent", "list", "--json"]);
    let list: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(list["agents"].as_array().unwrap().len(), 2);
}

#[test]
fn memory_show_and_tree() {
    let home = tempfile::tempdir().unwrap();
    assert!(run(home.path(), &["agent", "create", "a"]).status.success());
    let o = run(home.path(), &["memory", "show", "-a", "a", "persona.md"]);
    assert!(o.status.success());
    assert!(stdout(&o).starts_with("---\nname: Persona\n"));

    // Working-tree edits do not show; HEAD does.
    let list: Value =
        serde_json::from_str(&stdout(&run(home.path(), &["agent", "list", "--json"]))).unwrap();
    let id = list["agents"][0]["id"].as_str().unwrap();
    let mem = home.path().join("agents").join(id).join("memory");
    std::fs::write(mem.join("persona.md"), "EDITED").unwrap();
    assert!(!stdout(&run(home.path(), &["memory", "show", "persona.md"])).contains("EDITED"));

    for bad in ["../agent.json", "/etc/passwd", "a/./b.md", "nope.md"] {
        let o = run(home.path(), &["memory", "show", bad]);
        assert!(!o.status.success(), "{bad}");
        assert_eq!(stderr(&o).trim_end().lines().count(), 1);
    }

    let o = run(home.path(), &["memory", "tree", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["format"], "memfs-v2");
    let roles: Vec<(String, String)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().into(),
                e["role"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        roles,
        [
            ("MEMORY.md".to_string(), "root-index".to_string()),
            ("human.md".into(), "core".into()),
            ("persona.md".into(), "core".into())
        ]
    );
}

#[test]
fn home_flag_overrides_env() {
    let env_home = tempfile::tempdir().unwrap();
    let flag_home = tempfile::tempdir().unwrap();
    let o = run(
        env_home.path(),
        &[
            "--home",
            flag_home.path().to_str().unwrap(),
            "agent",
            "create",
            "x",
        ],
    );
    assert!(o.status.success());
    assert!(flag_home.path().join("agents").is_dir());
    assert!(!env_home.path().join("agents").exists());
}

/// The user's command line holds no internal entry: `--help` lists none,
/// and the old hidden words are unknown commands. The agent-side program
/// is its own executable with its own help.
#[test]
fn internal_entries_are_not_user_commands() {
    let home = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| run(home.path(), args);
    let help = run(&["--help"]);
    assert!(help.status.success(), "{}", stderr(&help));
    let text = stdout(&help);
    for word in ["__agent", "__probe", "__child", "turn", "probe"] {
        assert!(
            !text.lines().any(|l| l.trim_start().starts_with(word)),
            "{word} listed in --help:\n{text}"
        );
    }
    for word in ["__agent", "__probe", "__child"] {
        let o = run(&[word, "--agent-dir", "/nonexistent"]);
        assert_eq!(o.status.code(), Some(2), "{word} accepted: {}", stderr(&o));
        assert!(
            stderr(&o).contains("unrecognized subcommand"),
            "{}",
            stderr(&o)
        );
    }
    let agent = std::process::Command::new(env!("CARGO_BIN_EXE_mini-letta-agent"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(agent.status.success());
    let text = String::from_utf8_lossy(&agent.stdout);
    assert!(text.contains("turn") && text.contains("probe"), "{text}");
}
