//! A turn whose request is over the 4 MiB frame limit (issue 43 §5): the
//! supervisor dropped the line and answered without the request's id, so the
//! child waited for an answer that never came — the turn hung for good and,
//! in a cluster, the stuck host kept its lease and the agent. Now the error
//! carries the id, the ladder keeps requests under the limit, and a message
//! nothing can shrink fails the turn in seconds, leaving the conversation
//! free for the next one.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::*;

/// `chat -a al --prompt-file FILE` with `bytes` of text, bounded: a turn
/// that hangs fails the test instead of the suite.
fn chat_file(home: &Path, bytes: usize, fill: u8) -> (Output, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, vec![fill; bytes]).unwrap();
    let started = Instant::now();
    let o = std::process::Command::new("timeout")
        .arg("60")
        .arg(bin())
        .args(["chat", "-a", "al", "--prompt-file"])
        .arg(&file)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (o, started.elapsed())
}

fn chat(home: &Path, text: &str) -> (Output, Duration) {
    let started = Instant::now();
    let o = std::process::Command::new("timeout")
        .arg("60")
        .arg(bin())
        .args(["chat", "-a", "al", "-p", text])
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (o, started.elapsed())
}

/// The reproduction: a 2.5 MB message (the mock echoes it, so the
/// next request holds 5 MB of history) — the next turn compacts under the
/// frame limit and answers instead of stopping at `· step 1`.
#[test]
fn a_turn_after_a_huge_one_fits_the_frame_and_answers() {
    let home = open_home();
    let h = home.path();
    create_agent(h, &["al"]);
    let (o, _) = chat_file(h, 2_500_000, b'x');
    assert!(o.status.success(), "{}", stderr(&o));
    let (o, took) = chat(h, "hello again");
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(stdout(&o).contains("hello again"), "{}", stdout(&o));
    assert!(err.contains("compacted"), "the ladder compacted: {err}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// A 5 MB message fits no frame and nothing can shrink it: the turn fails
/// in seconds saying why, and the conversation is free — the next turn
/// runs and the huge message is not sent again.
#[test]
fn a_request_over_the_frame_limit_fails_in_seconds_and_releases_the_conversation() {
    let home = open_home();
    let h = home.path();
    create_agent(h, &["al"]);
    let (o, took) = chat_file(h, 5_000_000, b'y');
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert_ne!(o.status.code(), Some(124), "the turn hung: {err}");
    assert!(err.contains("4 MiB"), "names the limit: {err}");
    // No advice that cannot work: a larger window carries nothing more.
    assert!(err.contains("send a shorter message"), "{err}");
    assert!(!err.contains("--context-window"), "{err}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let (o, took) = chat(h, "still there?");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("still there?"), "{}", stdout(&o));
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let agent = std::fs::read_dir(h.join("agents"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("agent-"))
        .unwrap()
        .path();
    let sent = std::fs::metadata(agent.join("conversations/default/last-request.json"))
        .unwrap()
        .len();
    assert!(
        sent < 1_000_000,
        "the last request still carried the 5 MB message ({sent} bytes)"
    );
}
