//! The CLI's input and output: completions and man pages, colour only on a
//! terminal, JSON forms, tables and times, and the small frictions
//! (conversations that are not there, revisions that are not there, lines
//! past the end, commands that cannot run).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Output;

use common::{create_agent, open_home, run, stderr, stdout};
use serde_json::Value;

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// RFC 3339 UTC with whole seconds, the one display format.
fn is_display_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 20
        && s.ends_with('Z')
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && s.chars()
            .enumerate()
            .all(|(i, c)| [4, 7, 10, 13, 16, 19].contains(&i) || c.is_ascii_digit())
}

/// A roff man page: after clap_mangen's two-line preamble (the `Aq` quote
/// string, `.ie`/`.el`), the title macro `.TH` comes first.
fn is_man_page(text: &str) -> bool {
    text.lines()
        .find(|l| !l.starts_with(".ie ") && !l.starts_with(".el "))
        .is_some_and(|l| l.starts_with(".TH "))
}

#[test]
fn completions_for_every_shell_and_man_pages() {
    let home = tempfile::tempdir().unwrap();
    let o = run(home.path(), &["completions", "bash"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bash = stdout(&o);
    assert!(
        bash.contains("chat") && bash.contains("mini-letta"),
        "{bash}"
    );
    assert!(bash.contains("conversations"));
    assert!(
        !bash.contains("channel"),
        "internal commands are not completed"
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let o = run(home.path(), &["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        assert!(stdout(&o).contains("recompile"), "{shell}");
    }
    let o = run(home.path(), &["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));

    let o = run(home.path(), &["man"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(is_man_page(&page), "{}", &page[..page.len().min(200)]);
    assert!(page.contains(".TH mini-letta 1"));
    assert!(page.contains("completions"));

    let dir = home.path().join("man1");
    let o = run(home.path(), &["man", "--out", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for page in [
        "mini-letta.1",
        "mini-letta-memory-show.1",
        "mini-letta-sandbox-run.1",
    ] {
        let text = std::fs::read_to_string(dir.join(page)).unwrap();
        assert!(is_man_page(&text), "{page}");
        assert!(stdout(&o).contains(page), "the pages written are listed");
    }
}

/// Run `mini-letta agent show nope` on a pty: coloured unless `NO_COLOR`
/// says not to.
fn error_on_a_terminal(home: &Path, no_color: Option<&str>) -> Vec<u8> {
    let env: Vec<(&str, &str)> = no_color.map(|v| ("NO_COLOR", v)).into_iter().collect();
    let r = common::pty::run(home, &["agent", "show", "nope"], &env);
    assert_eq!(r.code, Some(1));
    r.out
}

#[test]
fn errors_are_coloured_only_on_a_terminal_without_no_color() {
    let home = tempfile::tempdir().unwrap();
    create_agent(home.path(), &["owl"]);
    let o = run(home.path(), &["agent", "show", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("mini-letta: error: "),
        "{}",
        stderr(&o)
    );
    assert!(
        !o.stderr.contains(&0x1b),
        "no escape in a pipe: {:?}",
        stderr(&o)
    );

    let tty = error_on_a_terminal(home.path(), None);
    let text = String::from_utf8_lossy(&tty);
    assert!(tty.contains(&0x1b), "colour on a terminal: {text:?}");
    assert!(text.contains("\x1b[1;31merror:\x1b[0m"), "{text:?}");
    let plain = error_on_a_terminal(home.path(), Some("1"));
    assert!(
        !plain.contains(&0x1b),
        "{:?}",
        String::from_utf8_lossy(&plain)
    );
    assert!(String::from_utf8_lossy(&plain).contains("mini-letta: error: "));
}

#[test]
fn prompt_and_recompile_refuse_a_conversation_that_is_not_there() {
    let home = tempfile::tempdir().unwrap();
    let id = create_agent(home.path(), &["owl"]);
    let conversations = home.path().join("agents").join(&id).join("conversations");
    for args in [
        &["prompt", "--conversation", "nope"][..],
        &["prompt", "--conversation", "nope", "--json"],
        &["recompile", "--conversation", "nope"],
    ] {
        let o = run(home.path(), args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&o).contains(r#"no conversation "nope" for agent owl (conversations: default)"#),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(!conversations.join("nope").exists(), "{args:?} created it");
    }

    // The default conversation always may be used; the first recompile
    // creates it, and then it is listed.
    let v = json(&run(home.path(), &["prompt", "--json"]));
    assert_eq!(v["agent"], id.as_str());
    assert_eq!(v["conversation"], "default");
    assert_eq!(v["cached"], false);
    assert!(v["system"].as_str().unwrap().contains("<memory"), "{v}");
    assert!(
        v["memfs_revision"].as_str().is_some_and(|r| r.len() == 40),
        "{v}"
    );
    let o = run(home.path(), &["recompile"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let cached = json(&run(home.path(), &["prompt", "--json"]));
    assert_eq!(cached["cached"], true);
    assert_eq!(cached["system"], v["system"]);
    let o = run(home.path(), &["prompt"]);
    assert_eq!(stdout(&o), v["system"].as_str().unwrap());
    assert_eq!(
        json(&run(home.path(), &["prompt", "--json", "--fresh"]))["cached"],
        false
    );

    // A conversation that exists is found, and named in the refusal.
    std::fs::create_dir(conversations.join("work")).unwrap();
    let o = run(home.path(), &["prompt", "--conversation", "work", "--json"]);
    assert_eq!(json(&o)["conversation"], "work");
    let o = run(home.path(), &["recompile", "--conversation", "nope"]);
    assert!(
        stderr(&o).contains("(conversations: default, work)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn conversations_memory_log_and_tree_are_tables_with_one_time_format() {
    let home = tempfile::tempdir().unwrap();
    create_agent(home.path(), &["owl"]);
    let o = run(home.path(), &["recompile"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(home.path(), &["conversations"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("ID       MESSAGES  IN CONTEXT  LAST MESSAGE")
    );
    assert_eq!(lines.next(), Some("default         0           0  -"));

    let o = run(
        home.path(),
        &["memory", "create", "notes.md", "--description", "Notes."],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&run(home.path(), &["memory", "log"]));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("COMMIT      TIME "), "{text}");
    assert!(lines[0].ends_with("SUMMARY"), "{text}");
    assert_eq!(lines.len(), 3, "{text}");
    for row in &lines[1..] {
        let cells: Vec<&str> = row.split("  ").filter(|c| !c.is_empty()).collect();
        assert_eq!(cells[0].len(), 10, "{row}");
        assert!(is_display_time(cells[1]), "{row}");
    }
    assert!(lines[1].ends_with("memory create: notes.md"), "{text}");

    let text = stdout(&run(home.path(), &["memory", "tree"]));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("memfs-v2 at "), "{text}");
    assert!(
        lines[1].starts_with("ROLE ") && lines[1].ends_with("BYTES  PATH"),
        "{text}"
    );
    assert!(lines.iter().any(|l| l.ends_with(" notes.md")), "{text}");
}

#[test]
fn memory_show_json_holds_the_file_and_its_frontmatter() {
    let home = tempfile::tempdir().unwrap();
    create_agent(home.path(), &["owl"]);
    let o = run(
        home.path(),
        &[
            "memory",
            "create",
            "notes.md",
            "--description",
            "Loose notes.",
            "--body",
            "- one",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let raw = run(home.path(), &["memory", "show", "notes.md"]);
    let v = json(&run(home.path(), &["memory", "show", "notes.md", "--json"]));
    assert_eq!(v["path"], "notes.md");
    assert_eq!(v["content"], stdout(&raw).as_str());
    assert_eq!(v["bytes"], raw.stdout.len());
    assert_eq!(v["description"], "Loose notes.");
    assert_eq!(v["frontmatter"]["name"], "Notes");
    assert_eq!(v["body"], "- one");
    assert_eq!(v["read_only"], false);
    assert!(v["revision"].as_str().is_some_and(|r| r.len() == 40), "{v}");
    assert!(v["role"].is_string(), "{v}");
}

#[test]
fn unknown_revisions_are_named_without_libgit2_codes() {
    let home = tempfile::tempdir().unwrap();
    create_agent(home.path(), &["owl"]);
    for (args, code) in [
        (&["memory", "diff", "badrev"][..], 1),
        (&["memory", "diff", "badrev", "--json"], 1),
        (&["memory", "validate", "--rev", "badrev"], 2),
    ] {
        let o = run(home.path(), args);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(r#"unknown revision "badrev""#),
            "{args:?}: {err}"
        );
        assert!(!err.contains("class=") && !err.contains("code="), "{err}");
    }
    let o = run(home.path(), &["memory", "diff", "HEAD"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn insert_refuses_a_line_past_the_end() {
    let home = tempfile::tempdir().unwrap();
    create_agent(home.path(), &["owl"]);
    let o = run(
        home.path(),
        &[
            "memory",
            "create",
            "notes.md",
            "--description",
            "Notes.",
            "--body",
            "a\nb\nc",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let before = stdout(&run(home.path(), &["memory", "show", "notes.md"]));
    for (line, message) in [
        (
            "999",
            "line 999 is past the end of notes.md (3 body lines); use a line between 1 and 4",
        ),
        (
            "0",
            "line 0 is not a line of notes.md (lines count from 1); use a line between 1 and 4",
        ),
    ] {
        let o = run(
            home.path(),
            &[
                "memory", "insert", "notes.md", "--text", "x", "--line", line,
            ],
        );
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains(message), "{}", stderr(&o));
        assert_eq!(
            stdout(&run(home.path(), &["memory", "show", "notes.md"])),
            before,
            "nothing changed"
        );
    }
    // The line after the last appends; line 1 goes first; no line appends.
    for (line, text) in [(Some("4"), "d"), (Some("1"), "first"), (None, "last")] {
        let mut args = vec!["memory", "insert", "notes.md", "--text", text];
        if let Some(l) = line {
            args.extend(["--line", l]);
        }
        let o = run(home.path(), &args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    let body = json(&run(home.path(), &["memory", "show", "notes.md", "--json"]))["body"].clone();
    assert_eq!(body, "first\na\nb\nc\nd\nlast");
}

/// `sandbox run` as shells do: 127 for a command that is not there, 126 for
/// one that cannot be executed; `-a` defaults to the only agent; `--json`
/// captures the output.
#[test]
fn sandbox_run_reports_commands_that_cannot_run_and_captures_with_json() {
    let home = open_home();
    create_agent(home.path(), &["owl"]);
    let o = run(
        home.path(),
        &[
            "sandbox",
            "run",
            "--isolation",
            "off",
            "--",
            "no-such-command-xyz",
        ],
    );
    assert_eq!(o.status.code(), Some(127), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("mini-letta: sandbox run: command not found: no-such-command-xyz"),
        "{}",
        stderr(&o)
    );

    let script = home.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let o = run(
        home.path(),
        &[
            "sandbox",
            "run",
            "--isolation",
            "off",
            "--",
            script.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(126), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "mini-letta: sandbox run: cannot execute {}: Permission denied",
            script.display()
        )),
        "{}",
        stderr(&o)
    );

    let o = run(
        home.path(),
        &[
            "sandbox",
            "run",
            "--isolation",
            "off",
            "--json",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["signal"], Value::Null);
    assert_eq!(v["stdout"], "out\n");
    assert_eq!(v["stderr"], "err\n");

    let o = run(
        home.path(),
        &[
            "sandbox",
            "run",
            "--isolation",
            "off",
            "--json",
            "--",
            "sh",
            "-c",
            "kill -9 $$",
        ],
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exit_code"], Value::Null, "{v}");
    assert_eq!(v["signal"], 9, "{v}");
    assert_eq!(o.status.code(), Some(128 + 9));

    // Confined, the same rule.
    if common::confinement_or_skip("sandbox_run_confined_command_not_found") {
        let o = run(
            home.path(),
            &["sandbox", "run", "--json", "--", "no-such-command-xyz"],
        );
        assert_eq!(o.status.code(), Some(127), "{}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(
            v["stderr"]
                .as_str()
                .unwrap()
                .contains("sandbox run: command not found: no-such-command-xyz"),
            "{v}"
        );
    }

    // With two agents, -a is needed.
    create_agent(home.path(), &["lark"]);
    let o = run(
        home.path(),
        &["sandbox", "run", "--isolation", "off", "--", "true"],
    );
    assert_eq!(o.status.code(), Some(1));
    let o = run(
        home.path(),
        &[
            "sandbox",
            "run",
            "-a",
            "lark",
            "--isolation",
            "off",
            "--",
            "true",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The README's `config.toml` is one the program reads, key for key.
#[test]
fn the_readme_config_example_is_valid() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let block = readme
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a toml block in README.md");
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), block).unwrap();
    let home = mini_letta::paths::Home::at(home.path());
    let cfg = mini_letta::model::config::ProviderConfig::load(&home).unwrap();
    assert_eq!(cfg.default_model.as_deref(), Some("openai/gpt-4o-mini"));
    assert_eq!(cfg.context_window, Some(128000));
    assert_eq!(cfg.mock_context_window, Some(900));
    assert_eq!(cfg.openai.base_url, "http://127.0.0.1:11434/v1");
    assert_eq!(cfg.anthropic.api_key_env, "ANTHROPIC_API_KEY");
    let quota = mini_letta::sandbox::volume::default_quota(&home)
        .unwrap()
        .unwrap();
    assert_eq!((quota.disk_mb, quota.inodes), (1024, 65536));
}

/// `mini-letta … | head`: a reader that goes away ends the command quietly
/// with success, never with a panic's message or an error line.
#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    let home = open_home();
    create_agent(home.path(), &["owl"]);
    let commands: &[&[&str]] = &[
        &["memory", "log", "-a", "owl"],
        &["memory", "show", "-a", "owl", "human.md"],
        &["memory", "tree", "-a", "owl"],
        &["agent", "list"],
        &["agent", "show", "-a", "owl"],
        &["prompt", "-a", "owl", "--fresh"],
        &["conversations", "-a", "owl"],
        &["recall", "search", "-a", "owl", "anything"],
        &["sandbox", "status"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        // The reader is gone before the command writes its first byte.
        drop(reader);
        let out = std::process::Command::new(common::bin())
            .args(*args)
            .env("MINI_LETTA_HOME", home.path())
            .env_remove("RUST_LOG")
            .stdout(writer)
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(
            out.status.success(),
            "{args:?} exited {:?}: {err}",
            out.status
        );
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?} said: {err}"
        );
    }
}

/// Issue 44: with a sandbox layer missing, every command's stderr carried
/// a log record (`WARN … sandbox layer missing: …`) — written by the
/// embedded supervisor before its records were sent to the home's log. At
/// default verbosity no record reaches a command's output; `-v` shows it,
/// and `run/supervisor.log` keeps it.
#[test]
fn no_log_record_reaches_a_commands_output_by_default() {
    let home = open_home();
    let h = home.path();
    create_agent(h, &["al"]);
    let on = |args: &[&str]| {
        std::process::Command::new(common::bin())
            .args(args)
            .env("MINI_LETTA_HOME", h)
            .env("MINI_LETTA_SANDBOX_DISABLE", "cgroup")
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    };
    for args in [
        &["chat", "-a", "al", "-p", "hello"][..],
        &["sandbox", "run", "--", "true"][..],
        &["memory", "show", "-a", "al", "human.md"][..],
        &["doctor", "-a", "al"][..],
    ] {
        let o = on(args);
        let err = stderr(&o);
        assert!(
            !err.contains("sandbox layer missing") && !err.contains(" WARN "),
            "{args:?} printed a log record: {err}"
        );
    }
    let o = on(&["-v", "sandbox", "run", "--", "true"]);
    assert!(
        stderr(&o).contains("sandbox layer missing"),
        "-v shows the records: {}",
        stderr(&o)
    );
    let log = std::fs::read_to_string(h.join("run/supervisor.log")).unwrap_or_default();
    assert!(
        log.contains("sandbox layer missing"),
        "the log keeps it: {log}"
    );
}
