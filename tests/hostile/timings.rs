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
