//! Turns that never lie: concurrent chats on one agent, errors shown in
//! plain `chat`, cancellation (Ctrl-C in a terminal, a signal, a client that
//! goes away) and a `supervisor stop` that a hanging model cannot hold up.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{bin, confinement_or_skip, create_agent, open_home, run, stderr, stdout, wait_until};
use serde_json::Value;

fn chat(home: &Path) -> Command {
    let mut c = Command::new(bin());
    c.env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .arg("chat");
    c
}

/// The file `path` at HEAD of the agent's memory repository.
fn at_head(home: &Path, agent: &str, path: &str) -> String {
    let paths = mini_letta::paths::Home::at(home).agent(agent).unwrap();
    let repo = mini_letta::memfs::repo::open_agent(&paths).unwrap();
    let tree = repo.head().unwrap().peel_to_tree().unwrap();
    let blob = tree
        .get_path(Path::new(path))
        .unwrap()
        .to_object(&repo)
        .unwrap()
        .peel_to_blob()
        .unwrap();
    String::from_utf8(blob.content().to_vec()).unwrap()
}

/// Every line of every conversation log parses and no message id repeats.
fn logs_are_sound(home: &Path, agent: &str) -> usize {
    let dir = home.join("agents").join(agent).join("conversations");
    let mut total = 0;
    for conv in std::fs::read_dir(&dir).unwrap() {
        let log = conv.unwrap().path().join("messages.jsonl");
        let Ok(text) = std::fs::read_to_string(&log) else {
            continue;
        };
        let mut ids = HashSet::new();
        for (n, line) in text.lines().enumerate() {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}:{}: {e}: {line}", log.display(), n + 1));
            let id = v["id"].as_str().unwrap().to_string();
            assert!(
                ids.insert(id.clone()),
                "{}: duplicate id {id}",
                log.display()
            );
            total += 1;
        }
    }
    total
}

fn uids_registered(agent: &str) -> usize {
    std::fs::read_to_string("/var/lib/mini-letta/.agent-uids")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some(agent))
        .count()
}

/// Twenty one-shot chats at once, each teaching a fact.
fn twenty_at_once(daemon: bool, one_conversation: bool) {
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["tenant"]);
    if daemon {
        let o = run(h, &["supervisor", "start"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let children: Vec<_> = (0..20)
        .map(|n| {
            let conversation = if one_conversation {
                "default".to_string()
            } else {
                format!("c{}", n % 5)
            };
            chat(h)
                .args(["-a", "tenant", "--conversation", &conversation])
                .args(["-p", &format!("记住: parallel fact {n}")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let human = at_head(h, &agent, "human.md");
    let mut succeeded = 0;
    for (n, o) in outputs.iter().enumerate() {
        let out = stdout(o);
        if o.status.success() && out.contains("已更新记忆（提交 ") {
            succeeded += 1;
            assert!(
                human.contains(&format!("- parallel fact {n}\n")),
                "turn {n} reported its fact saved, but HEAD's human.md lacks it:\n{human}"
            );
        } else {
            // A turn that did not run says so.
            assert!(
                !o.status.success() && stderr(o).contains("error"),
                "turn {n} neither succeeded nor said why: {out} / {}",
                stderr(o)
            );
        }
    }
    // Waiting, not refusing, is the rule: every one of them ran.
    assert_eq!(succeeded, 20, "outputs: {outputs:?}");
    assert!(logs_are_sound(h, &agent) >= 20 * 4);
    let o = run(h, &["chat", "-a", "tenant", "-p", "记住: afterwards"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(at_head(h, &agent, "human.md").contains("- afterwards\n"));
    if nix::unistd::geteuid().is_root() {
        assert_eq!(uids_registered(&agent), 1, "one agent, one uid");
    }
    if daemon {
        let o = run(h, &["supervisor", "stop"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let run_dir = h.join("run");
    assert!(!run_dir.join("supervisor.pid").exists());
    assert!(!run_dir.join("supervisor.sock").exists());
}

#[test]
fn twenty_chats_on_one_conversation_without_a_daemon() {
    if !confinement_or_skip("twenty_chats_on_one_conversation_without_a_daemon") {
        return;
    }
    twenty_at_once(false, true);
}

#[test]
fn twenty_chats_across_conversations_without_a_daemon() {
    if !confinement_or_skip("twenty_chats_across_conversations_without_a_daemon") {
        return;
    }
    twenty_at_once(false, false);
}

#[test]
fn twenty_chats_on_one_conversation_with_a_daemon() {
    if !confinement_or_skip("twenty_chats_on_one_conversation_with_a_daemon") {
        return;
    }
    twenty_at_once(true, true);
}

#[test]
fn twenty_chats_across_conversations_with_a_daemon() {
    if !confinement_or_skip("twenty_chats_across_conversations_with_a_daemon") {
        return;
    }
    twenty_at_once(true, false);
}

/// Messages and in-context ids of a conversation.
fn conversation_counts(home: &Path, agent: &str) -> (u64, u64) {
    let o = run(home, &["conversations", "-a", agent, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "default")
        .map(|c| {
            (
                c["messages"].as_u64().unwrap(),
                c["in_context"].as_u64().unwrap(),
            )
        })
        .unwrap_or((0, 0))
}

#[test]
fn configuration_errors_are_shown_and_nothing_is_stored() {
    let home = open_home();
    let h = home.path();
    create_agent(h, &["ed"]);
    let cases: Vec<(Vec<&str>, Option<&str>, Vec<&str>)> = vec![
        (
            vec!["--model", "bogus"],
            None,
            vec!["unknown model \"bogus\"", "openai/<model>"],
        ),
        (
            vec!["--model", "openai/gpt-4o-mini"],
            None,
            vec!["OPENAI_API_KEY"],
        ),
        (
            vec![],
            Some("[model]\ndefualt = \"mock\"\n"),
            vec!["config.toml", "line 2", "defualt"],
        ),
        (vec!["--conversation", "../x"], None, vec!["../x"]),
    ];
    for (extra, config, expect) in cases {
        match config {
            Some(c) => std::fs::write(h.join("config.toml"), c).unwrap(),
            None => {
                let _ = std::fs::remove_file(h.join("config.toml"));
            }
        }
        let o = chat(h)
            .args(["-a", "ed", "-p", "hello"])
            .args(&extra)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(!o.status.success(), "{extra:?}: {err}");
        assert!(!err.contains("stopped: error"), "{err}");
        for e in expect {
            assert!(err.contains(e), "{extra:?}: expected {e:?} in: {err}");
        }
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert_eq!(
            conversation_counts(h, "ed"),
            (0, 0),
            "{extra:?}: a turn that could not start stored something"
        );
    }
    let _ = std::fs::remove_file(h.join("config.toml"));
    // The same checks at `supervisor start`.
    std::fs::write(h.join("config.toml"), "[model]\ndefualt = \"mock\"\n").unwrap();
    let o = run(h, &["supervisor", "start"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("defualt"), "{}", stderr(&o));
    assert!(!h.join("run/supervisor.pid").exists());
}

#[test]
fn a_model_failure_is_printed_and_not_kept_as_an_answer() {
    if !confinement_or_skip("a_model_failure_is_printed_and_not_kept_as_an_answer") {
        return;
    }
    let server = common::http::Server::start(vec![common::http::Canned::status(
        400,
        r#"{"error":{"message":"the model x does not exist","type":"invalid_request_error"}}"#,
    )]);
    let home = open_home();
    let h = home.path();
    create_agent(h, &["fay"]);
    std::fs::write(
        h.join("config.toml"),
        format!(
            "[providers.openai]\nbase_url = \"http://127.0.0.1:{}/v1\"\n",
            server.port
        ),
    )
    .unwrap();
    let o = chat(h)
        .args(["-a", "fay", "-p", "hello", "--model", "openai/x"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("· error: "), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    // Kept for the record (the user message and the error), shown to the
    // model never: nothing of the failed turn is in context.
    assert_eq!(conversation_counts(h, "fay"), (2, 0));
    // And the conversation goes on with a model that works.
    let o = chat(h)
        .args(["-a", "fay", "-p", "hello again"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "mock: hello again");
}

/// Processes running as `uid`.
fn processes_of(uid: u32) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let meta = std::fs::metadata(e.path()).ok()?;
            (meta.uid() == uid && !common::process_gone(pid)).then_some(pid)
        })
        .collect()
}

fn sandbox_uid(home: &Path, agent: &str) -> Option<u32> {
    let text = std::fs::read_to_string(home.join("agents").join(agent).join("agent.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v["sandbox_uid"].as_u64().map(|u| u as u32)
}

fn live_children(home: &Path) -> usize {
    let o = run(home, &["ps", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["children"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter(|c| matches!(c["state"].as_str(), Some("starting" | "running")))
                .count()
        })
        .unwrap_or(0)
}

/// Reads a child's stream on a thread; `wait_for` polls what came.
struct Collector(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Collector {
    fn start(mut r: impl Read + Send + 'static) -> Self {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let b = buf.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = r.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                b.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
        Self(buf)
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
    fn wait_for(&self, what: &str, secs: u64) -> bool {
        wait_until(secs, || self.text().contains(what))
    }
}

fn stored_log(home: &Path, agent: &str) -> String {
    std::fs::read_to_string(
        home.join("agents")
            .join(agent)
            .join("conversations/default/messages.jsonl"),
    )
    .unwrap_or_default()
}

#[test]
fn ctrl_c_in_a_terminal_cancels_the_turn_and_the_chat_goes_on() {
    if !confinement_or_skip("ctrl_c_in_a_terminal_cancels_the_turn_and_the_chat_goes_on") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["gus"]);
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = pty.slave;
    let mut cmd = chat(h);
    cmd.args(["-a", "gus"])
        .env("TERM", "dumb")
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: setsid and ioctl are async-signal-safe; the pty becomes the
    // chat's controlling terminal, so ^C reaches it as a terminal's would.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            nix::unistd::setsid()?;
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let master = std::fs::File::from(pty.master);
    let out = Collector::start(master.try_clone().unwrap());
    let mut input = master;
    assert!(out.wait_for("chatting with gus", 20), "{}", out.text());
    input.write_all(b"run: sleep 60\r").unwrap();
    // The tool call's line (the terminal echoes the typed text too).
    assert!(out.wait_for("→ Bash sleep 60", 30), "{}", out.text());
    // The tool runs in the confined child: wait until it shows there.
    let uid = sandbox_uid(h, &agent).unwrap();
    assert!(wait_until(10, || !processes_of(uid).is_empty()));
    input.write_all(&[3]).unwrap(); // ^C
    assert!(out.wait_for("cancelled", 20), "{}", out.text());
    assert!(
        wait_until(10, || processes_of(uid).is_empty()),
        "the turn's processes outlived its cancel: {:?}",
        processes_of(uid)
    );
    assert_eq!(live_children(h), 0, "no child left in ps");
    assert!(child.try_wait().unwrap().is_none(), "the chat must go on");
    assert!(stored_log(h, &agent).contains("Interrupted by user"));
    input
        .write_all("记住: after the cancel\r".as_bytes())
        .unwrap();
    assert!(out.wait_for("已更新记忆", 30), "{}", out.text());
    assert!(at_head(h, &agent, "human.md").contains("- after the cancel\n"));
    // At the prompt again (line editing drops what was typed ahead of it).
    assert!(wait_until(10, || out
        .text()
        .rsplit("已更新记忆")
        .next()
        .unwrap_or("")
        .contains("> ")));
    input.write_all(&[4]).unwrap(); // ^D at the prompt leaves
    assert!(wait_until(20, || child.try_wait().unwrap().is_some()));
    assert_eq!(child.wait().unwrap().code(), Some(0), "{}", out.text());
    assert!(!h.join("run/supervisor.pid").exists());
    assert!(!h.join("run/supervisor.sock").exists());
    // What was typed at the terminal is in this agent's history.
    let history = std::fs::read_to_string(h.join("history").join(&agent)).unwrap();
    assert!(history.contains("记住: after the cancel"), "{history}");
}

#[test]
fn the_message_comes_from_stdin_or_a_file_and_piped_input_is_not_history() {
    if !confinement_or_skip("the_message_comes_from_stdin_or_a_file_and_piped_input_is_not_history")
    {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["joe"]);
    let piped = |args: &[&str], input: &[u8]| {
        let mut c = chat(h)
            .args(["-a", "joe"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(input).unwrap();
        c.wait_with_output().unwrap()
    };
    let o = piped(&["-p", "-"], "记住: from stdin\n".as_bytes());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(at_head(h, &agent, "human.md").contains("- from stdin\n"));
    let file = h.join("question.txt");
    std::fs::write(&file, "记住: from a file\n").unwrap();
    let o = chat(h)
        .args(["-a", "joe", "--prompt-file"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(at_head(h, &agent, "human.md").contains("- from a file\n"));
    let o = piped(&["-p", "-"], b"  \n");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("empty"), "{}", stderr(&o));
    // An interactive chat fed by a pipe answers, and keeps no history.
    let big = format!("mock input {}\n", "x".repeat(2 << 20));
    let o = piped(&[], format!("hello there\n{big}").as_bytes());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("mock: hello there"), "{}", stdout(&o));
    assert!(!h.join("history").join(&agent).exists());
    assert!(!h.join("chat-history").exists());
}

/// A one-shot chat running `sleep 60` in its turn, with its stderr read.
fn sleeping_one_shot(h: &Path) -> (std::process::Child, Collector) {
    let mut child = chat(h)
        .args(["-a", "hal", "-p", "run: sleep 60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = Collector::start(child.stderr.take().unwrap());
    assert!(err.wait_for("sleep 60", 30), "{}", err.text());
    (child, err)
}

#[test]
fn a_signal_to_a_one_shot_cancels_its_turn_and_leaves_nothing_behind() {
    if !confinement_or_skip("a_signal_to_a_one_shot_cancels_its_turn_and_leaves_nothing_behind") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["hal"]);
    for (sig, code) in [
        (nix::sys::signal::Signal::SIGINT, 130),
        (nix::sys::signal::Signal::SIGTERM, 143),
    ] {
        let (mut child, err) = sleeping_one_shot(h);
        let uid = sandbox_uid(h, &agent).unwrap();
        assert!(wait_until(10, || !processes_of(uid).is_empty()));
        let started = Instant::now();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
        assert!(wait_until(15, || child.try_wait().unwrap().is_some()));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(child.wait().unwrap().code(), Some(code), "{}", err.text());
        assert!(err.text().contains("cancelled"), "{}", err.text());
        assert!(wait_until(10, || processes_of(uid).is_empty()));
        assert!(
            !h.join("run/supervisor.pid").exists(),
            "{sig}: pid file left"
        );
        assert!(
            !h.join("run/supervisor.sock").exists(),
            "{sig}: socket left"
        );
    }
    assert_eq!(
        stored_log(h, &agent)
            .matches("\"kind\":\"interrupted\"")
            .count(),
        2
    );
}

#[test]
fn a_client_that_goes_away_cancels_its_turn() {
    if !confinement_or_skip("a_client_that_goes_away_cancels_its_turn") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["hal"]);
    let o = run(h, &["supervisor", "start"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (mut child, _err) = sleeping_one_shot(h);
    let uid = sandbox_uid(h, &agent).unwrap();
    assert!(wait_until(10, || !processes_of(uid).is_empty()));
    child.kill().unwrap(); // SIGKILL: no handler runs, the socket just closes
    child.wait().unwrap();
    assert!(
        wait_until(15, || processes_of(uid).is_empty() && live_children(h) == 0),
        "the turn of a client that went away kept running"
    );
    assert!(wait_until(5, || stored_log(h, &agent).contains("Interrupted by user")));
    let o = run(h, &["chat", "-a", "hal", "-p", "still there?"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(h, &["supervisor", "stop"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn supervisor_stop_does_not_wait_for_a_hanging_model() {
    if !confinement_or_skip("supervisor_stop_does_not_wait_for_a_hanging_model") {
        return;
    }
    // A "provider" that accepts and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let a = accepted.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            a.lock().unwrap().push(s);
        }
    });
    let home = open_home();
    let h = home.path();
    create_agent(h, &["ivy"]);
    std::fs::write(
        h.join("config.toml"),
        format!("[providers.openai]\nbase_url = \"http://127.0.0.1:{port}/v1\"\n"),
    )
    .unwrap();
    let o = run(h, &["supervisor", "start"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut turn = chat(h)
        .args(["-a", "ivy", "-p", "hello", "--model", "openai/slow"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(30, || !accepted.lock().unwrap().is_empty()));
    let started = Instant::now();
    let o = run(h, &["supervisor", "stop", "--timeout", "5", "--json"]);
    let took = started.elapsed();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(took < Duration::from_secs(5), "stop took {took:?}");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["how"], "stopped", "{v}");
    assert!(!h.join("run/supervisor.pid").exists());
    assert!(!h.join("run/supervisor.sock").exists());
    assert!(wait_until(10, || turn.try_wait().unwrap().is_some()));
    assert!(!turn.wait().unwrap().success());
}

#[test]
fn a_signal_to_sandbox_run_stops_its_embedded_supervisor_cleanly() {
    if !confinement_or_skip("a_signal_to_sandbox_run_stops_its_embedded_supervisor_cleanly") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["kit"]);
    let mut child = Command::new(bin())
        .env("MINI_LETTA_HOME", h)
        .args(["sandbox", "run", "-a", "kit", "--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let uid_known = || sandbox_uid(h, &agent).is_some();
    assert!(wait_until(20, uid_known));
    let uid = sandbox_uid(h, &agent).unwrap();
    assert!(wait_until(20, || !processes_of(uid).is_empty()));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_until(15, || child.try_wait().unwrap().is_some()));
    assert_eq!(child.wait().unwrap().code(), Some(143));
    assert!(wait_until(10, || processes_of(uid).is_empty()));
    assert!(!h.join("run/supervisor.pid").exists());
    assert!(!h.join("run/supervisor.sock").exists());
}

#[test]
fn memory_writers_of_one_agent_wait_for_the_lease() {
    if !confinement_or_skip("memory_writers_of_one_agent_wait_for_the_lease") {
        return;
    }
    let d = common::Daemon::start(&["lea"]);
    let h = d.path();
    // The operator's connection takes the agent's lease (by name).
    let mut holder = d.client();
    let v = holder
        .call_json(mini_letta::protocol::Call::MemoryLease {
            agent: Some("lea".into()),
        })
        .unwrap();
    assert_eq!(v["agent"], d.agents[0].as_str(), "{v}");
    let spawn = |args: &[&str]| {
        Command::new(bin())
            .env("MINI_LETTA_HOME", h)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut turn = spawn(&["chat", "-a", "lea", "-p", "记住: waited for the lease"]);
    let mut edit = spawn(&[
        "memory",
        "insert",
        "-a",
        "lea",
        "human.md",
        "--text",
        "- the operator's line",
    ]);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        turn.try_wait().unwrap().is_none(),
        "the turn's edit did not wait"
    );
    assert!(
        edit.try_wait().unwrap().is_none(),
        "the operator's edit did not wait"
    );
    assert!(!at_head(h, &d.agents[0], "human.md").contains("waited for the lease"));
    drop(holder); // the connection's end returns the lease
    let t = turn.wait_with_output().unwrap();
    let e = edit.wait_with_output().unwrap();
    assert!(t.status.success(), "{}", stderr(&t));
    assert!(e.status.success(), "{}", stderr(&e));
    let human = at_head(h, &d.agents[0], "human.md");
    assert!(human.contains("- waited for the lease\n"), "{human}");
    assert!(human.contains("- the operator's line\n"), "{human}");
}

/// The command lines of the live processes of `uid`.
fn command_lines_of(uid: u32) -> Vec<String> {
    processes_of(uid)
        .into_iter()
        .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .collect()
}

/// A `sandbox run` whose command found no supervisor runs one embedded; a
/// second client starts a long turn on it. The owner's command ends
/// (its supervisor drains: the socket file goes first), then the second
/// client goes away.
struct Draining {
    owner: std::process::Child,
    turn: std::process::Child,
    uid: u32,
    /// A control connection opened before the drain.
    early: mini_letta::protocol::client::Client,
}

fn embedded_supervisor_draining(h: &Path, agent: &str, drain_secs: Option<&str>) -> Draining {
    embedded_supervisor_draining_with(h, agent, drain_secs, || {})
}

/// As [`embedded_supervisor_draining`]; `before` runs once the owner's
/// supervisor answers (to connect more clients before it drains).
fn embedded_supervisor_draining_with(
    h: &Path,
    agent: &str,
    drain_secs: Option<&str>,
    before: impl FnOnce(),
) -> Draining {
    let mut owner = Command::new(bin());
    owner
        .env("MINI_LETTA_HOME", h)
        .env_remove("RUST_LOG")
        .args(["sandbox", "run", "-a", "mo", "--", "sleep", "4"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(s) = drain_secs {
        owner.env("MINI_LETTA_DRAIN_SECS", s);
    }
    let owner = owner.spawn().unwrap();
    assert!(wait_until(20, || h.join("run/supervisor.sock").exists()));
    let early = mini_letta::supervisor::connect(&mini_letta::paths::Home::at(h)).unwrap();
    before();
    let turn = chat(h)
        .args([
            "-a",
            "mo",
            "--conversation",
            "other",
            "-p",
            "run: sleep 600",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let uid_known = || sandbox_uid(h, agent).is_some();
    assert!(wait_until(20, uid_known));
    let uid = sandbox_uid(h, agent).unwrap();
    assert!(
        wait_until(20, || command_lines_of(uid)
            .iter()
            .any(|c| c.contains("sleep 600"))),
        "the second client's turn did not start its tool"
    );
    // The owner's command is done: its supervisor drains.
    assert!(
        wait_until(20, || !h.join("run/supervisor.sock").exists()),
        "the owner's supervisor did not start draining"
    );
    assert!(
        h.join("run/supervisor.pid").exists(),
        "it should still drain"
    );
    Draining {
        owner,
        turn,
        uid,
        early,
    }
}

#[test]
fn a_draining_embedded_supervisor_notices_a_client_that_went_away() {
    if !confinement_or_skip("a_draining_embedded_supervisor_notices_a_client_that_went_away") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["mo"]);
    let mut d = embedded_supervisor_draining(h, &agent, None);
    // The second client gives up: nobody waits for its turn any more.
    d.turn.kill().unwrap();
    d.turn.wait().unwrap();
    assert!(
        wait_until(30, || d.owner.try_wait().unwrap().is_some()),
        "the owner's command waited for the turn of a client that went away"
    );
    let out = d.owner.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(wait_until(10, || processes_of(d.uid).is_empty()));
    assert!(!h.join("run/supervisor.pid").exists());
    let log = h
        .join("agents")
        .join(&agent)
        .join("conversations/other/messages.jsonl");
    let interrupted = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("Interrupted by user")
    };
    assert!(wait_until(5, interrupted));
}

#[test]
fn a_draining_embedded_supervisor_waits_for_other_turns_only_so_long() {
    if !confinement_or_skip("a_draining_embedded_supervisor_waits_for_other_turns_only_so_long") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["mo"]);
    let d = embedded_supervisor_draining(h, &agent, Some("3"));
    let Draining {
        mut owner,
        turn,
        uid,
        mut early,
    } = d;
    // An open connection's new request is not taken, and it is told so
    // (send it again to the next supervisor) rather than left unanswered.
    let refused = early
        .call_json(mini_letta::protocol::Call::Ping {})
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(mini_letta::protocol::ErrorCode::NotTaken),
        "{refused}"
    );
    // The second client stays, its turn never ends by itself: the drain
    // gives up after 3 s, stops the turn and ends the command.
    assert!(
        wait_until(30, || owner.try_wait().unwrap().is_some()),
        "the owner's command waited without bound for another client's turn"
    );
    let out = owner.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stopped waiting"),
        "the owner was not told why: {}",
        stderr(&out)
    );
    let t = turn.wait_with_output().unwrap();
    assert!(
        !t.status.success(),
        "a turn cut short must not look finished"
    );
    assert!(wait_until(10, || processes_of(uid).is_empty()));
    assert!(!h.join("run/supervisor.pid").exists());
}

#[test]
fn a_chat_turn_a_draining_supervisor_did_not_take_goes_to_the_next_one() {
    if !confinement_or_skip("a_chat_turn_a_draining_supervisor_did_not_take_goes_to_the_next_one") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let agent = create_agent(h, &["mo"]);
    // An interactive chat on the owner's supervisor, one turn done.
    let mut repl = None;
    let mut out = None;
    let d = embedded_supervisor_draining_with(h, &agent, Some("4"), || {
        let mut c = chat(h)
            .args(["-a", "mo", "--conversation", "repl"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let o = Collector::start(c.stdout.take().unwrap());
        c.stdin.as_mut().unwrap().write_all(b"first\n").unwrap();
        assert!(o.wait_for("mock: first", 20), "{}", o.text());
        repl = Some(c);
        out = Some(o);
    });
    let (mut repl, out) = (repl.unwrap(), out.unwrap());
    // Its next turn reaches a draining supervisor: not taken there, it
    // runs on the next one (the chat's own, once the owner has gone).
    repl.stdin.as_mut().unwrap().write_all(b"second\n").unwrap();
    assert!(
        out.wait_for("mock: second", 60),
        "the turn was lost: {}",
        out.text()
    );
    drop(repl.stdin.take());
    assert!(wait_until(30, || repl.try_wait().unwrap().is_some()));
    assert!(repl.wait().unwrap().success());
    let mut owner = d.owner;
    assert!(wait_until(30, || owner.try_wait().unwrap().is_some()));
    let log = h
        .join("agents")
        .join(&agent)
        .join("conversations/repl/messages.jsonl");
    let text = std::fs::read_to_string(log).unwrap();
    assert_eq!(text.matches("mock: second").count(), 1, "{text}");
}

/// `chat -p --timings`: one list of marks from the four processes of a
/// turn (CLI, supervisor, child stage, agent program) on one clock, in the
/// order the turn reaches them, and the phases between them; without the
/// flag the answer carries none.
#[test]
fn a_timed_turn_shows_the_marks_of_every_process_in_order() {
    if !confinement_or_skip("turn timings through the child stage") {
        return;
    }
    let home = open_home();
    let h = home.path();
    create_agent(h, &["owl"]);
    run(h, &["supervisor", "start"]);
    let o = chat(h)
        .args(["-a", "owl", "-p", "hi", "--json", "--timings"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let marks = doc["timings"]["marks"].as_array().unwrap();
    let at = |name: &str| {
        marks
            .iter()
            .find(|m| m["name"] == name)
            .and_then(|m| m["at_us"].as_u64())
            .unwrap_or_else(|| panic!("no mark {name} in {marks:?}"))
    };
    let order = [
        "cli.main",
        "cli.connected",
        "cli.sent",
        "sup.received",
        "sup.slot_taken",
        "sup.child_planned",
        "stage.start",
        "stage.namespaces",
        "stage.landlock",
        "stage.seccomp",
        "stage.exec",
        "agent.main",
        "agent.loaded",
        "agent.user_logged",
        "agent.model_asked",
        "agent.model_answered",
        "agent.response_logged",
        "agent.done",
        "sup.child_exited",
        "sup.answered",
        "cli.answered",
    ];
    for w in order.windows(2) {
        assert!(
            at(w[0]) <= at(w[1]),
            "{} ({}) after {} ({})",
            w[0],
            at(w[0]),
            w[1],
            at(w[1])
        );
    }
    let phases = doc["timings"]["phases"].as_array().unwrap();
    assert_eq!(phases.len(), marks.len() - 1);
    let whole = (at("cli.answered") - at("cli.main")) as f64 / 1000.0;
    let sum: f64 = phases.iter().filter_map(|p| p["ms"].as_f64()).sum();
    assert!(sum >= whole - 0.01, "phases {sum} ms < whole {whole} ms");
    // The events the turn printed carry no timings event of the child.
    assert!(
        doc["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["type"] != "timings")
    );
    // Text mode: the table on stderr, the reply alone on stdout.
    let o = chat(h)
        .args(["-a", "owl", "-p", "hi", "--timings"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("timings (ms)") && stderr(&o).contains("agent.model_answered"));
    assert!(!stdout(&o).contains("timings"), "{}", stdout(&o));
    // Only a one-shot turn is timed; an interactive chat says so.
    let o = chat(h).args(["-a", "owl", "--timings"]).output().unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--timings needs a one-shot message"),
        "{}",
        stderr(&o)
    );
    // Not asked: no marks anywhere.
    let o = chat(h)
        .args(["-a", "owl", "-p", "hi", "--json"])
        .output()
        .unwrap();
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(doc.get("timings").is_none(), "{doc}");
    run(h, &["supervisor", "stop"]);
}
