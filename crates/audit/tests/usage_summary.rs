//! The usage summary against the log it sums: `usage` reads the same
//! numbers with it as without it (whole log, `--since`, across rolled-over
//! files), a summary that does not hold is not believed, a tampered one is
//! caught by `audit verify`, and the parallel walk names the same first
//! problem a line-by-line walk does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use mini_letta_audit::read::{self, Filter, Usage};
use mini_letta_audit::verify::{self, Problem};
use mini_letta_audit::{Entry, Writer};
use mini_letta_core::paths::Home;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// Records `from..from + n` after `prev`, as text lines (a valid chain),
/// at days `2025-03-01` on (`per_day` a day), of varied kinds.
fn lines(from: u64, n: u64, per_day: u64, prev: &mut [u8; 32]) -> Vec<String> {
    let mut out = Vec::new();
    for i in from..from + n {
        let day = 1 + i / per_day;
        let secs = (i % per_day) * 80_000 / per_day;
        let time = format!(
            "2025-03-{day:02}T{:02}:{:02}:{:02}.000000Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        );
        let agent = ["\"agent-a\"", "\"agent-b\"", "null"][(i % 3) as usize];
        let rest = match i % 7 {
            0 => ",\"input_tokens\":7,\"output_tokens\":3,\"model\":\"m\"".to_string(),
            1 => ",\"cpu_us\":1501,\"peak_memory_bytes\":4096".into(),
            2 => ",\"conversation\":\"c\",\"pid\":4".into(),
            3 => ",\"arguments_sha256\":\"ab\"".into(),
            4 => ",\"egress_bytes\":100".into(),
            5 => ",\"note\":\"quote \\\" é\",\"input_tokens\":2".into(),
            _ => String::new(),
        };
        let kind = [
            "model", "exit", "spawn", "tool", "egress", "model", "budget",
        ][(i % 7) as usize];
        let line = format!(
            "{{\"seq\":{},\"prev\":\"{}\",\"time\":\"{time}\",\"kind\":\"{kind}\",\"agent\":{agent},\"role\":\"agent\"{rest}}}",
            i + 1,
            hex(prev),
        );
        *prev = Sha256::digest(line.as_bytes()).into();
        out.push(line);
    }
    out
}

fn write(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// A home with two rolled-over files and a current one (records over
/// several days), then records appended by a writer keeping the summary,
/// rolling over as it goes.
fn home_with_summary() -> (tempfile::TempDir, Home) {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path());
    std::fs::create_dir_all(home.audit_dir()).unwrap();
    let mut prev = [0u8; 32];
    write(&home.audit_rotated(1), &lines(0, 300, 200, &mut prev));
    write(&home.audit_rotated(2), &lines(300, 300, 200, &mut prev));
    write(&home.audit_log(), &lines(600, 250, 200, &mut prev));
    let mut w = Writer::open(&home).unwrap().rotate_at(20_000).track_usage();
    for i in 0..200u64 {
        let e = Entry::new(
            "model",
            Some(["agent-a", "agent-c"][(i % 2) as usize]),
            None,
        )
        .with("input_tokens", i)
        .with("output_tokens", 1);
        w.append(&[e]).unwrap();
    }
    drop(w);
    assert!(home.audit_usage_summary().exists());
    assert!(home.audit_rotated(3).exists(), "the writer rolled over");
    (dir, home)
}

/// Usage summed independently, line by line, from every file.
fn by_hand(home: &Home, filter: &Filter) -> BTreeMap<String, Usage> {
    let mut files: Vec<_> = (1..)
        .map(|n| home.audit_rotated(n))
        .take_while(|p| p.exists())
        .collect();
    files.push(home.audit_log());
    let mut out: BTreeMap<String, (Usage, u64)> = BTreeMap::new();
    for f in files {
        for line in std::fs::read_to_string(f).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let Some(agent) = v["agent"].as_str() else {
                continue;
            };
            if filter.agent.as_deref().is_some_and(|a| a != agent)
                || filter
                    .since
                    .as_deref()
                    .is_some_and(|s| v["time"].as_str().unwrap() < s)
            {
                continue;
            }
            let (u, cpu) = out.entry(agent.into()).or_insert_with(|| {
                (
                    Usage {
                        agent: agent.into(),
                        ..Usage::default()
                    },
                    0,
                )
            });
            let n = |k: &str| v[k].as_u64().unwrap_or(0);
            match v["kind"].as_str().unwrap() {
                "spawn" if v["conversation"].is_string() => u.turns += 1,
                "model" => {
                    u.model_calls += 1;
                    u.input_tokens += n("input_tokens");
                    u.output_tokens += n("output_tokens");
                }
                "tool" => u.tool_calls += 1,
                "exit" => {
                    *cpu += n("cpu_us");
                    u.peak_memory_bytes = u.peak_memory_bytes.max(n("peak_memory_bytes"));
                }
                "budget" => u.budget_refusals += 1,
                _ => {}
            }
            u.egress_bytes += n("egress_bytes");
        }
    }
    out.into_iter()
        .map(|(k, (mut u, cpu))| {
            u.cpu_ms = cpu.div_ceil(1000);
            (k, u)
        })
        .collect()
}

fn filters() -> Vec<Filter> {
    let mut all = vec![Filter::default()];
    let today = read::parse_since("1h").unwrap();
    for since in [
        "2025-01-01T00:00:00.000000Z",
        "2025-03-01T00:00:00.000000Z",
        "2025-03-02T12:00:00.000000Z",
        "2025-03-04T00:00:00.000000Z",
        "2025-03-05T23:00:00.000000Z",
        today.as_str(),
        "2999-01-01T00:00:00.000000Z",
    ] {
        for agent in [None, Some("agent-a"), Some("agent-c")] {
            all.push(Filter {
                agent: agent.map(str::to_string),
                kind: None,
                since: Some(since.to_string()),
            });
        }
    }
    all.push(Filter {
        agent: Some("agent-b".into()),
        ..Filter::default()
    });
    all
}

#[test]
fn usage_from_the_summary_is_usage_from_the_log() {
    let (_dir, home) = home_with_summary();
    let report = verify::verify(&home, None).unwrap();
    assert!(report.ok(), "{:?}", report.problem);
    let mut with = Vec::new();
    for f in filters() {
        let got = read::usage(&home, &f).unwrap();
        assert_eq!(got, by_hand(&home, &f), "{f:?}");
        assert!(!got.is_empty() || f.since.is_some(), "{f:?}");
        with.push(got);
    }
    // Without the summary (the log read whole): the same numbers.
    std::fs::remove_file(home.audit_usage_summary()).unwrap();
    for (f, want) in filters().iter().zip(&with) {
        assert_eq!(&read::usage(&home, f).unwrap(), want, "{f:?}");
    }
}

/// Another appender (the CLI) writes past the summary, and rolls the log
/// over: the summary still holds, and the records after it are read.
#[test]
fn records_after_the_summary_and_a_rollover_by_another_appender_are_counted() {
    let (_dir, home) = home_with_summary();
    let mut w = Writer::open(&home).unwrap().rotate_at(1);
    for i in 0..3 {
        let e = Entry::new("model", Some("agent-a"), None).with("input_tokens", 1000 + i);
        w.append(&[e]).unwrap();
    }
    drop(w);
    for f in filters() {
        assert_eq!(read::usage(&home, &f).unwrap(), by_hand(&home, &f), "{f:?}");
    }
    assert!(verify::verify(&home, None).unwrap().ok());
    // The supervisor's writer picks up from there.
    let mut w = Writer::open(&home).unwrap().track_usage();
    w.append(&[Entry::new("tool", Some("agent-c"), None)])
        .unwrap();
    drop(w);
    for f in filters() {
        assert_eq!(read::usage(&home, &f).unwrap(), by_hand(&home, &f), "{f:?}");
    }
    assert!(verify::verify(&home, None).unwrap().ok());
}

fn edit_summary(home: &Home, f: impl FnOnce(&mut Value)) {
    let path = home.audit_usage_summary();
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

#[test]
fn a_tampered_summary_is_caught_by_verify() {
    let (_dir, home) = home_with_summary();
    let saved = std::fs::read(home.audit_usage_summary()).unwrap();
    edit_summary(&home, |v| {
        let tokens = &mut v["days"]["2025-03-02"]["agents"]["agent-a"]["input_tokens"];
        *tokens = json!(tokens.as_u64().unwrap() + 1);
    });
    let report = verify::verify(&home, None).unwrap();
    match &report.problem {
        Some(p @ Problem::UsageSummaryMismatch { detail, .. }) => {
            assert!(
                detail.contains("2025-03-02") && detail.contains("agent-a"),
                "{p}"
            );
            assert!(p.to_string().contains("usage summary"), "{p}");
        }
        other => panic!("{other:?}"),
    }
    // A day moved to start later (which would drop records of `--since`).
    std::fs::write(home.audit_usage_summary(), &saved).unwrap();
    edit_summary(&home, |v| {
        let start = &mut v["days"]["2025-03-03"]["start"]["offset"];
        *start = json!(start.as_u64().unwrap() + 10);
    });
    assert!(matches!(
        verify::verify(&home, None).unwrap().problem,
        Some(Problem::UsageSummaryMismatch { .. })
    ));
    // An agent added.
    std::fs::write(home.audit_usage_summary(), &saved).unwrap();
    edit_summary(&home, |v| {
        v["days"]["2025-03-01"]["agents"]["agent-z"] = json!({
            "turns": 0, "model_calls": 0, "input_tokens": 0, "output_tokens": 0,
            "tool_calls": 0, "cpu_us": 0, "peak_memory_bytes": 0,
            "egress_bytes": 0, "budget_refusals": 0
        });
    });
    assert!(matches!(
        verify::verify(&home, None).unwrap().problem,
        Some(Problem::UsageSummaryMismatch { .. })
    ));
}

#[test]
fn a_summary_that_does_not_hold_is_not_believed() {
    let (_dir, home) = home_with_summary();
    let want: Vec<_> = filters().iter().map(|f| by_hand(&home, f)).collect();
    let check = |why: &str| {
        for (f, w) in filters().iter().zip(&want) {
            assert_eq!(&read::usage(&home, f).unwrap(), w, "{why}: {f:?}");
        }
        let r = verify::verify(&home, None).unwrap();
        assert!(r.ok(), "{why}: {:?}", r.problem);
    };
    let saved = std::fs::read(home.audit_usage_summary()).unwrap();
    std::fs::write(home.audit_usage_summary(), b"{\"version\":1,\"seq\":").unwrap();
    check("unreadable");
    std::fs::write(home.audit_usage_summary(), &saved).unwrap();
    // Another chain's: its head is not this log's.
    edit_summary(&home, |v| {
        v["head"] = json!("ab".repeat(32));
        v["days"]["2025-03-01"]["agents"]["agent-a"]["turns"] = json!(999);
    });
    check("another chain's");
    // Ahead of the log: it claims a record past the end.
    std::fs::write(home.audit_usage_summary(), &saved).unwrap();
    edit_summary(&home, |v| {
        v["seq"] = json!(v["seq"].as_u64().unwrap() + 5);
        v["end"]["offset"] = json!(v["end"]["offset"].as_u64().unwrap() + 1000);
        v["days"]["2025-03-01"]["agents"]["agent-a"]["turns"] = json!(999);
    });
    check("ahead");
    // The log's tail cut under it.
    std::fs::write(home.audit_usage_summary(), &saved).unwrap();
    let text = std::fs::read_to_string(home.audit_log()).unwrap();
    let kept: Vec<&str> = text.lines().collect();
    std::fs::write(home.audit_log(), kept[..kept.len() - 2].join("\n") + "\n").unwrap();
    let want: Vec<_> = filters().iter().map(|f| by_hand(&home, f)).collect();
    for (f, w) in filters().iter().zip(&want) {
        assert_eq!(&read::usage(&home, f).unwrap(), w, "cut: {f:?}");
    }
    // The supervisor's writer makes it again.
    let mut w = Writer::open(&home).unwrap().track_usage();
    w.append(&[Entry::new("tool", Some("agent-a"), None)])
        .unwrap();
    drop(w);
    let fresh: Value =
        serde_json::from_slice(&std::fs::read(home.audit_usage_summary()).unwrap()).unwrap();
    let cut_at: Value = serde_json::from_str(kept[kept.len() - 3]).unwrap();
    let last = cut_at["seq"].as_u64().unwrap() + 1;
    assert_eq!(fresh["seq"], json!(last));
    assert!(verify::verify(&home, None).unwrap().ok());
    for f in filters() {
        assert_eq!(read::usage(&home, &f).unwrap(), by_hand(&home, &f), "{f:?}");
    }
}

/// A log longer than a read block (several parts, several blocks): an
/// altered line, a removed one and a torn tail in the middle of it are
/// named as a walk line by line names them.
#[test]
fn the_parallel_walk_names_the_first_problem_of_a_large_log() {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path());
    std::fs::create_dir_all(home.audit_dir()).unwrap();
    let mut prev = [0u8; 32];
    let all = lines(0, 60_000, 10_000, &mut prev);
    write(&home.audit_log(), &all);
    assert!(std::fs::metadata(home.audit_log()).unwrap().len() > 9 << 20);
    let r = verify::verify(&home, None).unwrap();
    assert!(r.ok() && r.records == 60_000, "{:?}", r.problem);
    assert_eq!(r.head, Some(hex(&prev)));
    for at in [1usize, 17_777, 33_000, 59_998] {
        let mut edited = all.clone();
        edited[at] = edited[at].replace("\"role\":\"agent\"", "\"role\":\"agenT\"");
        write(&home.audit_log(), &edited);
        let r = verify::verify(&home, None).unwrap();
        let seq = at as u64 + 1;
        assert_eq!(
            r.problem,
            Some(Problem::Altered { seq, next: seq + 1 }),
            "{at}"
        );
        assert_eq!(r.last_seq, seq, "{at}");
        assert_eq!(
            r.head,
            Some(hex(&Sha256::digest(edited[at].as_bytes()))),
            "{at}"
        );
    }
    let mut removed = all.clone();
    removed.remove(40_000);
    write(&home.audit_log(), &removed);
    let r = verify::verify(&home, None).unwrap();
    assert_eq!(
        r.problem,
        Some(Problem::Missing {
            seq: 40_001,
            after: 40_000,
            found: 40_002
        })
    );
    let mut junk = all.clone();
    junk.insert(25_000, "not a record".into());
    junk.insert(25_001, "nor this".into());
    write(&home.audit_log(), &junk);
    let r = verify::verify(&home, None).unwrap();
    assert_eq!(
        r.problem,
        Some(Problem::NotARecord {
            after: 25_000,
            file: home.audit_log(),
            line: 25_002
        })
    );
    let mut text = all.join("\n") + "\n";
    text.push_str("{\"seq\":60001,\"pr");
    std::fs::write(home.audit_log(), text).unwrap();
    let r = verify::verify(&home, None).unwrap();
    assert_eq!(
        r.problem,
        Some(Problem::TornTail {
            after: 60_000,
            bytes: 16
        })
    );
}
