//! The marks of `chat --timings` come partly from the agent child (its own
//! and the stage's): a hostile agent program's marks must not put its text
//! on the operator's terminal or grow without bound.

use crate::common::{create_agent, install_with_agent_program, open_home};

/// An agent program that answers a turn with a `done` event and then a
/// `timings` event whose names hold escape sequences, capitals, a huge
/// name and thousands of marks: `chat --timings` shows only well-formed
/// marks, at most 256 of them from the child.
#[test]
fn a_hostile_agent_programs_marks_are_checked() {
    let home = open_home();
    create_agent(home.path(), &["demo"]);
    let dir = tempfile::tempdir().unwrap();
    let mut marks = vec![
        r#"{"name":"evil.\u001b]0;owned\u0007","at_us":1}"#.to_string(),
        r#"{"name":"Evil.Caps","at_us":2}"#.to_string(),
        format!(r#"{{"name":"{}","at_us":3}}"#, "x".repeat(5000)),
    ];
    marks.extend((0..5000).map(|i| format!(r#"{{"name":"flood.{i}","at_us":{i}}}"#)));
    let events = format!(
        "{{\"type\":\"done\",\"stop_reason\":\"end_turn\",\"text\":\"ok\",\"steps\":1,\
         \"usage\":{{\"input_tokens\":1,\"output_tokens\":1}}}}\n\
         {{\"type\":\"timings\",\"marks\":[{}]}}\n",
        marks.join(",")
    );
    let events_file = dir.path().join("events.jsonl");
    std::fs::write(&events_file, events).unwrap();
    let cli = install_with_agent_program(
        dir.path(),
        &format!("#!/bin/sh\ncat >/dev/null\ncat {}\n", events_file.display()),
    );
    // The events file must be readable from inside the child's sandbox:
    // under strict isolation it is not, so the program runs unconfined.
    let chat = |extra: &[&str]| {
        let o = std::process::Command::new(&cli)
            .env("MINI_LETTA_HOME", home.path())
            .args([
                "chat",
                "-a",
                "demo",
                "-p",
                "hi",
                "--isolation",
                "off",
                "--timings",
            ])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}");
        (String::from_utf8_lossy(&o.stdout).into_owned(), err)
    };
    let (out, _) = chat(&["--json"]);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = doc["timings"]["marks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.contains('\u{1b}') && !n.contains("Evil") && n.len() <= 40),
        "{names:?}"
    );
    let flood = names.iter().filter(|n| n.starts_with("flood.")).count();
    assert!(flood <= 256, "{flood} marks kept from the child");
    assert!(names.contains(&"cli.main") && names.contains(&"sup.received"));
    // Text mode prints the table; nothing of the escape reaches stderr.
    let (_, err) = chat(&[]);
    assert!(
        err.contains("timings (ms)") && !err.contains('\u{1b}'),
        "{err}"
    );
}

/// `sandbox run --timings`: the CLI's, the supervisor's and the stage's
/// marks of one confined command, in the order they happen.
#[test]
fn sandbox_run_timings_show_every_layer_in_order() {
    if !crate::common::confinement_or_skip("sandbox_run_timings_show_every_layer_in_order") {
        return;
    }
    let home = open_home();
    create_agent(home.path(), &["demo"]);
    for daemon in [false, true] {
        if daemon {
            let o = crate::common::run(home.path(), &["supervisor", "start"]);
            assert!(o.status.success(), "{}", crate::common::stderr(&o));
        }
        let o = crate::common::run(
            home.path(),
            &["sandbox", "run", "--timings", "--json", "--", "echo", "hi"],
        );
        assert!(o.status.success(), "{}", crate::common::stderr(&o));
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(doc["stdout"], "hi\n", "the command's output is unchanged");
        let marks = doc["timings"]["marks"].as_array().unwrap();
        let at = |name: &str| {
            marks
                .iter()
                .find(|m| m["name"] == name)
                .and_then(|m| m["at_us"].as_u64())
                .unwrap_or_else(|| panic!("no {name} (daemon {daemon}) in {marks:?}"))
        };
        let order = [
            "cli.main",
            "cli.connected",
            "sup.spawn_received",
            "sup.child_planned",
            "stage.start",
            "stage.namespaces",
            "stage.landlock",
            "stage.seccomp",
            "stage.hello",
            "sup.child_exited",
            "sup.exit_announced",
            "cli.exited",
        ];
        for w in order.windows(2) {
            assert!(at(w[0]) <= at(w[1]), "{} after {}: {marks:?}", w[0], w[1]);
        }
        // The supervisor reads a child's hello on its connection and sees
        // its exit in the reaper: two tasks, so a child as quick as `echo`
        // may be reaped before its hello is read (seen under load): the
        // hello is read after the stage sent it.
        assert!(
            at("stage.hello") <= at("sup.child_hello"),
            "sup.child_hello before stage.hello: {marks:?}"
        );
        assert!(doc["timings"]["phases"].as_array().unwrap().len() >= order.len() - 1);
        // Without --json the table goes to stderr; stdout is the command's.
        let o = crate::common::run(
            home.path(),
            &["sandbox", "run", "--timings", "--", "echo", "hi"],
        );
        assert_eq!(crate::common::stdout(&o), "hi\n");
        let err = crate::common::stderr(&o);
        assert!(
            err.contains("timings (ms)") && err.contains("stage.seccomp"),
            "{err}"
        );
    }
    crate::common::run(home.path(), &["supervisor", "stop"]);
}

/// A command may write to its channel (descriptor 3) after its stage said
/// hello: another hello, with marks of its own choosing. The supervisor
/// keeps only well-formed names and a bounded number of marks per child,
/// and nothing of the text reaches the operator's terminal.
#[test]
fn a_commands_own_hello_marks_are_checked_and_bounded() {
    let home = open_home();
    create_agent(home.path(), &["demo"]);
    let mut marks = vec![
        r#"{"name":"evil.\u001b]0;owned\u0007","at_us":1}"#.to_string(),
        r#"{"name":"Evil.Caps","at_us":2}"#.to_string(),
    ];
    marks.extend((0..3000).map(|i| format!(r#"{{"name":"flood.{i}","at_us":{i}}}"#)));
    let line = format!(
        r#"{{"type":"hello","version":{},"peer":"child","marks":[{}]}}"#,
        mini_letta::protocol::PROTOCOL_VERSION,
        marks.join(",")
    );
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hello.jsonl");
    std::fs::write(&script, format!("{line}\n{line}\n")).unwrap();
    let o = crate::common::run(
        home.path(),
        &[
            "sandbox",
            "run",
            "--isolation",
            "off",
            "--timings",
            "--json",
            "--",
            "sh",
            "-c",
            &format!("cat {} >&3; sleep 0.2", script.display()),
        ],
    );
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = doc["timings"]["marks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.contains('\u{1b}') && !n.contains("Evil")),
        "{names:?}"
    );
    let flood = names.iter().filter(|n| n.starts_with("flood.")).count();
    assert!(flood > 0, "the command's hello was not read: {names:?}");
    assert!(flood <= 32, "{flood} of the command's marks kept");
    // Its repeated hellos add no supervisor marks either (the stage's
    // hello and the command's two are one `sup.child_hello`).
    let hellos = names.iter().filter(|n| **n == "sup.child_hello").count();
    assert_eq!(hellos, 1, "{names:?}");
    assert!(names.contains(&"sup.child_exited") && names.contains(&"cli.exited"));
}

/// `memory insert --timings`: the commit's steps on stderr, the command's
/// own output unchanged.
#[test]
fn memory_write_timings_show_the_commit_steps() {
    let home = open_home();
    create_agent(home.path(), &["demo"]);
    let o = crate::common::run(
        home.path(),
        &[
            "memory",
            "insert",
            "human.md",
            "--text",
            "likes tea",
            "--timings",
        ],
    );
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    assert!(crate::common::stdout(&o).starts_with("committed "));
    let err = crate::common::stderr(&o);
    let names: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.starts_with("timings (ms)"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    let expected = [
        "cli.main",
        "cli.agent_found",
        "cli.repo_open",
        "op.edited",
        "commit.locked",
        "commit.staged",
        "commit.validated",
        "commit.written",
        "cli.done",
    ];
    let positions: Vec<Option<usize>> = expected
        .iter()
        .map(|e| names.iter().position(|n| n == e))
        .collect();
    assert!(
        positions.iter().all(Option::is_some) && positions.windows(2).all(|w| w[0] < w[1]),
        "{names:?}"
    );
    // A read names no commit step.
    let o = crate::common::run(home.path(), &["memory", "show", "human.md", "--timings"]);
    assert!(o.status.success());
    let err = crate::common::stderr(&o);
    assert!(
        err.contains("cli.head_read") && !err.contains("commit."),
        "{err}"
    );
}
