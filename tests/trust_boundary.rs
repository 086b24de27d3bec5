//! The supervisor's trust boundary, attacked as a hostile child would: from
//! inside a child (its channel on descriptor 3, shell tools, a small C
//! program speaking raw bytes), against a real supervisor. Each test is an
//! attack that worked before the boundary was closed; each asserts that the
//! host, the operator and other tenants are untouched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Daemon, agent_bin, bin, confinement_or_skip, hostile_child, run, stderr, wait_until};
use mini_letta::protocol::client::{Client, ClientError};
use mini_letta::protocol::{Call, Event, ServerFrame, SpawnParams, StdioMode};
use serde_json::{Value, json};

/// Spawn a child and return its id.
fn spawn(
    c: &mut Client,
    agent: &str,
    role: &str,
    isolation: &str,
    model: Option<&str>,
    argv: &[&str],
) -> u64 {
    let v = c
        .call_json(Call::Spawn(SpawnParams {
            agent: agent.into(),
            role: role.into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            stdio: StdioMode::Null,
            workspace: None,
            isolation: Some(isolation.into()),
            model: model.map(str::to_string),
        }))
        .unwrap();
    v["child"].as_u64().unwrap()
}

/// Wait for `child`'s exit event on a subscribed client (30 s at most).
fn wait_exit(c: &mut Client, child: u64) -> Value {
    c.set_timeout(Some(Duration::from_secs(30))).unwrap();
    loop {
        match c.read_frame() {
            Ok(ServerFrame::Event(Event::ChildExit(exit))) if exit.child == child => {
                return serde_json::to_value(exit).unwrap();
            }
            Ok(_) => {}
            Err(e) => panic!("child {child} did not exit within 30 s: {e}"),
        }
    }
}

/// Run a shell script as a child of `role` and wait for it.
fn run_script(d: &Daemon, agent: usize, role: &str, isolation: &str, script: &str) -> Value {
    let mut c = d.client();
    c.call_json(Call::Subscribe {}).unwrap();
    let child = spawn(
        &mut c,
        &d.agents[agent],
        role,
        isolation,
        None,
        &["sh", "-c", script],
    );
    wait_exit(&mut c, child)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn supervisor_log(d: &Daemon) -> Vec<u8> {
    std::fs::read(d.path().join("run/supervisor.log")).unwrap()
}

/// Start a shell script as an unconfined tool child of the first agent
/// (the supervisor-side attacks need no confinement to be made).
fn spawn_hostile(d: &Daemon, script: &str) -> u64 {
    spawn(
        &mut d.client(),
        &d.agents[0],
        "tool",
        "off",
        None,
        &["sh", "-c", script],
    )
}

/// The child's row in `ps` once it has ended.
fn ended(d: &Daemon, child: u64) -> Option<Value> {
    let rows = d.client().call_json(Call::Ps {}).unwrap();
    rows["children"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"].as_u64() == Some(child))
        .filter(|r| r["state"] == "exited" || r["state"] == "killed")
        .cloned()
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn rss_kib(pid: u32) -> u64 {
    read(Path::new(&format!("/proc/{pid}/status")))
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// A root-owned file outside every home, with its content and metadata.
struct Victim {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Victim {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("victim.txt");
        std::fs::write(&path, "original\n").unwrap();
        Self { _dir: dir, path }
    }

    fn assert_untouched(&self) {
        assert_eq!(read(&self.path), "original\n", "the host file changed");
        let names: Vec<_> = std::fs::read_dir(self.path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["victim.txt"], "files appeared beside it");
    }
}

fn model_request(model: &str) -> Value {
    json!({"request": {"model": model, "system": "",
        "messages": [{"role": "user", "parts": [{"type": "text", "text": "hi"}]}]}})
}

/// Attack 1: `model.complete` naming `mock/scripted:<path>` made the
/// supervisor open a script the child wrote and write `<path>.cursor.tmp<pid>`
/// through a symlink the child planted — a root-owned host file changed.
#[test]
fn a_scripted_model_path_from_a_child_touches_no_host_file() {
    let d = Daemon::start(&["a"]);
    let victim = Victim::new();
    let mem = d.memory_dir(0);
    let script = mem.join("s.json");
    std::fs::write(&script, r#"{"turns":[{"text":"owned"}]}"#).unwrap();
    let pid = d.pid();
    for name in [format!("s.json.cursor.tmp{pid}"), "s.json.cursor".into()] {
        std::os::unix::fs::symlink(&victim.path, mem.join(name)).unwrap();
    }
    let params = model_request(&format!("mock/scripted:{}", script.display()));
    let exit = run_script(
        &d,
        0,
        "agent",
        "off",
        &format!(
            "{} channel call model.complete '{params}' > out.txt 2> err.txt; echo $? > rc.txt",
            agent_bin().display()
        ),
    );
    assert_eq!(exit["code"], 0, "{exit}");
    let dir = d.path().join("agents").join(&d.agents[0]);
    assert_ne!(read(&dir.join("rc.txt")).trim(), "0");
    let err = read(&dir.join("err.txt"));
    assert!(err.contains("launched with model"), "{err}");
    victim.assert_untouched();

    // Not from the control socket either: no peer names the script's path.
    let e = d
        .client()
        .call_json(Call::ModelComplete {
            request: params["request"].clone(),
        })
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::Remote(b) if b.message.contains("MINI_LETTA_SCRIPTED_MODEL")),
        "{e:?}"
    );
    victim.assert_untouched();
}

/// The model is the one recorded at launch (the operator's choice, else the
/// agent's); the scripted fixture comes only from the supervisor's own
/// start-up environment.
#[test]
fn a_child_uses_only_the_model_recorded_at_launch() {
    let fixtures = tempfile::tempdir().unwrap();
    let script = fixtures.path().join("script.json");
    std::fs::write(&script, r#"{"turns":[{"text":"scripted hello"}]}"#).unwrap();
    let d = Daemon::start_with_env(
        &["a"],
        &[("MINI_LETTA_SCRIPTED_MODEL", script.to_str().unwrap())],
    );
    let me = agent_bin();
    let call = |model: &str, out: &str| {
        format!(
            "{} channel call model.complete '{}' > {out}.out 2> {out}.err || true",
            me.display(),
            model_request(model)
        )
    };
    let mut c = d.client();
    c.call_json(Call::Subscribe {}).unwrap();
    // Launched with the scripted model: an empty name uses it, "mock" is refused.
    let s = format!("{}; {}", call("", "scripted"), call("mock", "other"));
    let child = spawn(
        &mut c,
        &d.agents[0],
        "agent",
        "off",
        Some("mock/scripted"),
        &["sh", "-c", &s],
    );
    assert_eq!(wait_exit(&mut c, child)["code"], 0);
    // Launched with the agent's model (mock): a provider it was not given
    // is refused, its own works.
    let s = format!("{}; {}", call("mock", "own"), call("openai/gpt-4o", "key"));
    let child = spawn(
        &mut c,
        &d.agents[0],
        "agent",
        "off",
        None,
        &["sh", "-c", &s],
    );
    assert_eq!(wait_exit(&mut c, child)["code"], 0);

    let dir = d.path().join("agents").join(&d.agents[0]);
    assert!(read(&dir.join("scripted.out")).contains("scripted hello"));
    assert!(read(&dir.join("other.err")).contains("launched with model \"mock/scripted\""));
    assert!(read(&dir.join("own.out")).contains("mock: hi"));
    assert!(read(&dir.join("key.out")).is_empty());
    assert!(read(&dir.join("key.err")).contains("launched with model \"mock\""));
}

/// Attack 7 (events) and the model proxy: each role calls only its column
/// of the allow-list.
#[test]
fn each_role_calls_only_its_methods() {
    let d = Daemon::start(&["a"]);
    let me = agent_bin();
    let probe = |method: &str, params: &str, name: &str| {
        format!(
            "if {} channel call {method} '{params}' >/dev/null 2> {name}.err; then echo ok > {name}.rc; else echo refused > {name}.rc; fi",
            me.display()
        )
    };
    let event = r#"{"conversation":"default","event":{"type":"tool_call","name":"Bash"}}"#;
    let model = model_request("mock").to_string();
    let commit = r#"{"paths":["human.md"],"message":"x"}"#;
    let cases: &[(&str, &str, &str, &str)] = &[
        ("tool", "model.complete", &model, "refused"),
        ("tool", "turn.event", event, "refused"),
        ("tool", "memory.status", "{}", "ok"),
        ("tool", "ping", "{}", "ok"),
        ("agent", "turn.event", event, "ok"),
        ("agent", "model.complete", &model, "ok"),
        // A sub-agent commits only on the worktree the supervisor launched
        // it with; one started without (child.spawn) has nowhere to commit.
        ("memory-worker", "memory.commit", commit, "refused"),
        ("reflection", "memory.commit", commit, "refused"),
        // Tasks come from the child table: none was recorded for these.
        ("memory-worker", "task.get", "{}", "refused"),
        ("agent", "task.get", "{}", "refused"),
        // Only the agent's turn loop starts memory workers.
        ("tool", "worker.start", r#"{"instruction":"x"}"#, "refused"),
        (
            "reflection",
            "worker.start",
            r#"{"instruction":"x"}"#,
            "refused",
        ),
        // Only an integration turn merges, and only its reflection's branch.
        ("agent", "memory.merge", r#"{"branch":"main"}"#, "refused"),
        ("tool", "memory.merge", r#"{"branch":"main"}"#, "refused"),
        ("agent", "recall.delegate", r#"{"query":"x"}"#, "refused"),
        // A child cannot cancel turns (its own or another conversation's),
        // nor hold up an agent's memory writers unless it may write memory.
        (
            "tool",
            "turn.cancel",
            r#"{"conversation":"default"}"#,
            "refused",
        ),
        (
            "agent",
            "turn.cancel",
            r#"{"conversation":"default"}"#,
            "refused",
        ),
        ("memory-worker", "memory.lease", "{}", "refused"),
        ("tool", "memory.lease", "{}", "ok"),
        ("tool", "model.info", "{}", "refused"),
        ("memory-worker", "events.subscribe", "{}", "refused"),
        (
            "reflection",
            "child.spawn",
            r#"{"agent":"a","role":"tool","argv":["true"]}"#,
            "refused",
        ),
    ];
    let dir = d.path().join("agents").join(&d.agents[0]);
    for (i, (role, method, params, want)) in cases.iter().enumerate() {
        let name = format!("case{i}");
        let exit = run_script(&d, 0, role, "off", &probe(method, params, &name));
        assert_eq!(exit["code"], 0, "{exit}");
        let got = read(&dir.join(format!("{name}.rc")));
        assert_eq!(got.trim(), *want, "{role} {method}");
        if *want == "refused" {
            let err = read(&dir.join(format!("{name}.err")));
            // Allowed to the role, but not with what this child was given.
            let expected = match (*role, *method) {
                ("memory-worker" | "reflection", "memory.commit") => {
                    "launched without a worktree".to_string()
                }
                ("memory-worker", "task.get") => "no task was recorded for this child".to_string(),
                ("agent", "memory.merge") => "no reflection is being integrated".to_string(),
                ("agent", "recall.delegate") => "not started for a conversation".to_string(),
                _ => format!("{method} is not available to children (role {role})"),
            };
            assert!(err.contains(&expected), "{role} {method}: {err}");
        }
    }
}

/// A tool command run by the agent (`/bin/sh` from the Bash tool) inherited
/// the agent's channel and could spend the operator's key through it.
#[test]
fn the_agents_tool_commands_inherit_no_channel() {
    if !confinement_or_skip("the_agents_tool_commands_inherit_no_channel") {
        return;
    }
    let home = common::open_home();
    let o = run(home.path(), &["agent", "create", "a"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let cmd = format!(
        "{{ if [ -e /proc/$$/fd/3 ]; then echo fd3=$(readlink /proc/$$/fd/3); else echo fd3=none; fi; \
         echo env=${{MINI_LETTA_CHANNEL_FD:-unset}}; \
         {} channel ping >/dev/null 2>&1; echo ping=$?; }} > $MEMORY_DIR/probe.txt",
        agent_bin().display()
    );
    let o = run(
        home.path(),
        &["chat", "-a", "a", "-p", &format!("run: {cmd}")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // The agent's directory (not `index.json` beside it, whichever
    // readdir gives first).
    let agents: Vec<_> = std::fs::read_dir(home.path().join("agents"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    let probe = read(&agents[0].join("memory/probe.txt"));
    assert!(!probe.contains("socket:"), "{probe}");
    assert!(probe.contains("env=unset"), "{probe}");
    assert!(
        !probe.contains("ping=0"),
        "the tool reached the supervisor: {probe}"
    );
}

/// Attack 5: descriptors a child sent with `SCM_RIGHTS` piled up in the
/// supervisor until `accept` failed.
#[test]
fn descriptors_from_a_child_are_closed_and_refused() {
    let d = Daemon::start(&["a"]);
    let pid = d.pid();
    let hostile = hostile_child();
    let before = fd_count(pid);
    let child = spawn_hostile(&d, &format!("{} fds 2000 > fds.out", hostile.display()));
    let mut most = before;
    let exit = loop {
        most = most.max(fd_count(pid));
        if let Some(row) = ended(&d, child) {
            break row;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let out = read(&d.path().join("agents").join(&d.agents[0]).join("fds.out"));
    assert_eq!(exit["code"], 0, "{exit} {out}");
    assert!(out.contains("answered"), "{out}");
    let refused: usize = out
        .split("refused=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap();
    // Every frame that carried descriptors was refused, none answered.
    assert_eq!(refused, 2000, "{out}");
    assert!(out.contains("pongs_with_fds=0 "), "{out}");
    // A plain frame glued into the same read as the one carrying
    // descriptors is answered; the refusal goes to the carrier.
    let glue = spawn_hostile(&d, &format!("{} glue > glue.out", hostile.display()));
    let exit = loop {
        if let Some(row) = ended(&d, glue) {
            break row;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = read(&d.path().join("agents").join(&d.agents[0]).join("glue.out"));
    assert_eq!(exit["code"], 0, "{exit} {out}");
    assert_eq!(
        out.trim(),
        "plain_answered=1 fds_refused=1 fds_answered=0",
        "descriptors were attributed to the wrong frame"
    );
    // 16,000 descriptors were sent; none may have stayed.
    assert!(
        most < before + 64,
        "descriptors peaked at {most} (from {before})"
    );
    assert!(
        wait_until(5, || fd_count(pid) <= before + 4),
        "descriptors: {} after, {before} before",
        fd_count(pid)
    );
    // The control socket still works.
    assert_eq!(d.client().call_json(Call::Ping {}).unwrap()["pong"], true);
}

/// Attack 6: a child that sends pings and never reads grew the supervisor
/// by hundreds of megabytes; another agent must still be served meanwhile.
#[test]
fn a_child_that_never_reads_is_cut_off_and_others_are_served() {
    let d = Daemon::start(&["a", "b"]);
    let pid = d.pid();
    let hostile = hostile_child();
    let before = rss_kib(pid);
    let child = spawn_hostile(
        &d,
        &format!("{} flood 3000000 > flood.out", hostile.display()),
    );
    let mut other = d.client();
    let mut slowest = Duration::ZERO;
    let mut most = before;
    loop {
        let t = Instant::now();
        other
            .call_json(Call::MemoryStatus {
                agent: Some(d.agents[1].clone()),
            })
            .unwrap();
        slowest = slowest.max(t.elapsed());
        most = most.max(rss_kib(pid));
        if ended(&d, child).is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = read(&d.path().join("agents").join(&d.agents[0]).join("flood.out"));
    assert!(
        out.starts_with("closed"),
        "the supervisor kept the connection: {out}"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "another agent waited {slowest:?}"
    );
    assert!(
        most < before + 64 * 1024,
        "the supervisor grew from {before} KiB to {most} KiB"
    );
    let log = String::from_utf8_lossy(&supervisor_log(&d)).into_owned();
    assert!(
        log.contains("disconnected a child that does not read"),
        "{log}"
    );
    // Nothing it made the supervisor hold is kept after it is gone.
    let after = rss_kib(pid);
    assert!(
        after < before + 32 * 1024,
        "the supervisor kept {after} KiB (from {before} KiB)"
    );
}

/// Attack 7: newlines in a child's `log` message (or its output) wrote a
/// line into `supervisor.log` that looked like a record of another child.
#[test]
fn child_text_cannot_forge_log_records() {
    let d = Daemon::start(&["a"]);
    let params = json!({"level": "info",
        "message": "x\nFAKE INFO mini_letta::supervisor::server: child exited child=99\u{1b}[2J"});
    let script = format!(
        "{} channel call log '{params}'; printf 'out\\033]52;c;QUFB\\007\\rFAKE2 child exited\\n'",
        agent_bin().display()
    );
    let exit = run_script(&d, 0, "tool", "off", &script);
    assert_eq!(exit["code"], 0, "{exit}");
    assert!(wait_until(5, || {
        String::from_utf8_lossy(&supervisor_log(&d)).contains("FAKE2")
    }));
    let log = supervisor_log(&d);
    assert!(
        !log.iter().any(|b| *b == 0x1b || *b == 0x07 || *b == b'\r'),
        "raw control bytes reached the log"
    );
    let text = String::from_utf8_lossy(&log);
    for line in text.lines() {
        assert!(!line.starts_with("FAKE"), "forged line: {line}");
        if line.contains("FAKE") {
            assert!(
                line.contains(&d.agents[0]) && line.contains("child log")
                    || line.contains("child output"),
                "child text without the child's identity: {line}"
            );
        }
    }
    assert!(text.contains("child log"), "{text}");
}

/// Attack 8: the supervisor spared processes by name, so a program calling
/// itself `ml-ns-monitor` never got SIGTERM.
#[test]
fn signals_reach_a_program_named_like_a_wrapper() {
    if !confinement_or_skip("signals_reach_a_program_named_like_a_wrapper") {
        return;
    }
    let d = Daemon::start(&["a"]);
    let mut c = d.client();
    c.call_json(Call::Subscribe {}).unwrap();
    let inner = "trap 'echo got > memory/term.txt; exit 0' TERM; sleep 1000 & \
                 echo ready > memory/ready.txt; while :; do sleep 0.05; done";
    let script = format!(
        "cp /bin/sh memory/{} && exec ./memory/{} -c \"{inner}\"",
        mini_letta::sandbox::namespaces::MONITOR_COMM,
        mini_letta::sandbox::namespaces::MONITOR_COMM,
    );
    let child = spawn(
        &mut c,
        &d.agents[0],
        "tool",
        "strict",
        None,
        &["sh", "-c", &script],
    );
    let mem = d.memory_dir(0);
    assert!(wait_until(10, || mem.join("ready.txt").exists()));
    c.call_json(Call::Kill {
        child,
        signal: Some(15),
    })
    .unwrap();
    let exit = wait_exit(&mut c, child);
    assert_eq!(
        std::fs::read_to_string(mem.join("term.txt"))
            .unwrap_or_default()
            .trim(),
        "got",
        "the program was spared: {exit}"
    );
}

/// Attack 12 (uids): a uid was handed out again as soon as its agent
/// directory was not found (a moved or unmounted home).
#[test]
fn uids_are_never_handed_out_again() {
    if !confinement_or_skip("uids_are_never_handed_out_again") {
        return;
    }
    let registry = || -> std::collections::HashSet<u32> {
        std::fs::read_to_string(mini_letta::sandbox::identity::REGISTRY)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').next()?.parse().ok())
            .collect()
    };
    let uid_of = |d: &Daemon| -> u32 {
        let mut c = d.client();
        c.call_json(Call::Subscribe {}).unwrap();
        let child = spawn(&mut c, &d.agents[0], "tool", "strict", None, &["true"]);
        wait_exit(&mut c, child);
        let record = read(
            &d.path()
                .join("agents")
                .join(&d.agents[0])
                .join("agent.json"),
        );
        let v: Value = serde_json::from_str(&record).unwrap();
        v["sandbox_uid"].as_u64().unwrap() as u32
    };
    let first = Daemon::start(&["a"]);
    let u1 = uid_of(&first);
    let moved = tempfile::tempdir().unwrap();
    let _ = run(first.path(), &["supervisor", "stop", "--timeout", "5"]);
    // The home is moved away: its agent directory is no longer found.
    std::fs::rename(first.path(), moved.path().join("home")).unwrap();
    let before = registry();
    assert!(before.contains(&u1));
    let second = Daemon::start(&["b"]);
    let u2 = uid_of(&second);
    assert!(
        !before.contains(&u2),
        "uid {u2} was handed out again (the first agent had {u1})"
    );
    // Put the first home back so its drop stops nothing stray.
    std::fs::rename(moved.path().join("home"), first.path()).unwrap();
}

/// Attack 9: every role could list and read the whole agent directory
/// (`conversations/`, `reflections/`), which their profiles leave out. Each
/// role sees exactly what `sandbox-profiles/<role>.toml` lists.
#[test]
fn each_role_sees_exactly_its_profile() {
    if !confinement_or_skip("each_role_sees_exactly_its_profile") {
        return;
    }
    // (entry, [agent, tool, memory-worker, reflection]): "rw", "r" or "-",
    // as the profiles say.
    let table: &[(&str, [&str; 4])] = &[
        (".", ["-", "-", "-", "-"]),
        ("agent.json", ["r", "r", "r", "r"]),
        ("memory", ["rw", "rw", "r", "r"]),
        ("memory.git", ["r", "r", "r", "r"]),
        ("conversations", ["rw", "-", "-", "r"]),
        ("reflections", ["r", "-", "-", "r"]),
        ("tmp", ["rw", "rw", "rw", "rw"]),
        ("memory-worktrees", ["-", "-", "-", "-"]),
    ];
    let roles = ["agent", "tool", "memory-worker", "reflection"];
    let d = Daemon::start(&["a"]);
    let dir = d.path().join("agents").join(&d.agents[0]);
    // One confined run first: it creates the agent-owned directories.
    assert_eq!(run_script(&d, 0, "tool", "strict", "true")["code"], 0);
    for sub in ["conversations/default", "reflections", "memory-worktrees"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(dir.join("conversations/default/messages.jsonl"), "{}\n").unwrap();
    let mut script = String::from("out=tmp/visibility-$ROLE.txt; : > $out\n");
    for (entry, _) in table {
        script.push_str(&format!(
            "if [ -d {entry} ]; then ls {entry} >/dev/null 2>&1 && r=r || r=-; \
             touch {entry}/.probe 2>/dev/null && w=w || w=-; rm -f {entry}/.probe 2>/dev/null; \
             else cat {entry} >/dev/null 2>&1 && r=r || r=-; \
             (: >> {entry}) 2>/dev/null && w=w || w=-; fi; echo \"{entry} $r$w\" >> $out\n"
        ));
    }
    // TMPDIR is a directory the child can write (it was a /tmp it could not).
    script.push_str(
        "(: > \"$TMPDIR/.probe\") 2>/dev/null && echo \"TMPDIR w\" >> $out || echo \"TMPDIR -\" >> $out\n",
    );
    for (i, role) in roles.iter().enumerate() {
        let s = script.replace("$ROLE", role);
        let exit = run_script(&d, 0, role, "strict", &s);
        assert_eq!(exit["code"], 0, "{role}: {exit}");
        let seen = read(&dir.join(format!("tmp/visibility-{role}.txt")));
        assert!(seen.lines().any(|l| l == "TMPDIR w"), "{role}: {seen}");
        for (entry, want) in table {
            let want = match want[i] {
                "rw" => "rw",
                "r" => "r-",
                _ => "--",
            };
            let line = format!("{entry} {want}");
            assert!(
                seen.lines().any(|l| l == line),
                "{role} should see {line}; saw:\n{seen}"
            );
        }
    }
}

/// Attack 10: a child under `sandbox run` got the operator's terminal: it
/// turned echo off for good, resized the window and wrote OSC 0 (title) and
/// OSC 52 (clipboard) sequences to it. Now it gets a pty of its own.
#[test]
fn the_operators_terminal_is_relayed_never_handed_over() {
    use nix::sys::termios::{LocalFlags, tcgetattr};
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let d = Daemon::start(&["a"]);
    let size = nix::pty::Winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // The operator's terminal: the slave side of a pty this test reads.
    let operator = nix::pty::openpty(Some(&size), None).unwrap();
    let echo = |fd: &std::os::fd::OwnedFd| {
        tcgetattr(fd)
            .unwrap()
            .local_flags
            .contains(LocalFlags::ECHO)
    };
    let window = |fd: &std::os::fd::OwnedFd| {
        let mut ws = nix::pty::Winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ fills the struct.
        assert_eq!(
            unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) },
            0
        );
        (ws.ws_row, ws.ws_col)
    };
    assert!(echo(&operator.slave));
    let hostile = "stty -echo; stty rows 5 cols 7; \
                   printf '\\033]52;c;SGVsbG8=\\007\\033]0;pwned\\007\\033[2Jvisible \\033[1;32mgreen\\033[0m\\n'";
    let status = std::process::Command::new(bin())
        .args([
            "sandbox",
            "run",
            "-a",
            "a",
            "--isolation",
            "off",
            "--",
            "sh",
            "-c",
        ])
        .arg(hostile)
        .env("MINI_LETTA_HOME", d.path())
        .stdin(operator.slave.try_clone().unwrap())
        .stdout(operator.slave.try_clone().unwrap())
        .stderr(operator.slave.try_clone().unwrap())
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(echo(&operator.slave), "echo was left off");
    assert_eq!(window(&operator.slave), (24, 80), "the window was resized");
    // What reached the operator's terminal.
    nix::fcntl::fcntl(
        &operator.master,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut master = std::fs::File::from(operator.master);
    let mut buf = [0u8; 4096];
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("visible"), "{text:?}");
    assert!(
        text.contains("\u{1b}[1;32mgreen"),
        "colour is kept: {text:?}"
    );
    for bad in ["\u{1b}]52", "\u{1b}]0", "\u{1b}[2J", "pwned"] {
        assert!(
            !text.contains(bad),
            "{bad:?} reached the terminal: {text:?}"
        );
    }

    // --raw is the operator's explicit choice: the sequence goes through.
    let status = std::process::Command::new(bin())
        .args([
            "sandbox",
            "run",
            "-a",
            "a",
            "--isolation",
            "off",
            "--raw",
            "--",
        ])
        .args(["printf", "\\033]0;raw-title\\007done\\n"])
        .env("MINI_LETTA_HOME", d.path())
        .stdin(operator.slave.try_clone().unwrap())
        .stdout(operator.slave.try_clone().unwrap())
        .stderr(operator.slave.try_clone().unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let mut seen = Vec::new();
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("\u{1b}]0;raw-title"), "{text:?}");
}

/// The operator's own commands on an agent whose working tree belongs to
/// the agent's uid: libgit2's owner check refused them ("repository path …
/// is not owned by current user"). Exactly the agent directories of the
/// operator's home are trusted; a foreign repository still is not.
#[test]
fn the_operators_memory_commands_work_on_agent_owned_trees() {
    if !confinement_or_skip("the_operators_memory_commands_work_on_agent_owned_trees") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let d = Daemon::start(&["a"]);
    assert_eq!(run_script(&d, 0, "tool", "strict", "true")["code"], 0);
    let mem = d.memory_dir(0);
    assert_ne!(
        std::fs::metadata(&mem).unwrap().uid(),
        0,
        "the agent owns its tree"
    );
    let mem_s = mem.to_str().unwrap();
    std::fs::write(
        mem.join("persona.md"),
        read(&mem.join("persona.md")) + "- speaks plainly\n",
    )
    .unwrap();
    let commands: &[&[&str]] = &[
        &["memory", "compile", "--memory-dir", mem_s],
        &["memory", "show", "-a", "a", "human.md"],
        &["memory", "tree", "-a", "a"],
        &["memory", "validate", "-a", "a"],
        &["memory", "validate", "--staged", "-a", "a"],
        &["memory", "validate", "--rev", "HEAD", "-a", "a"],
        &["memory", "log", "-a", "a"],
        &["memory", "diff", "-a", "a"],
        &[
            "memory",
            "commit",
            "-a",
            "a",
            "--message",
            "persona",
            "persona.md",
        ],
        &[
            "memory",
            "insert",
            "-a",
            "a",
            "human.md",
            "--text",
            "- likes tea",
        ],
        &[
            "memory",
            "set-description",
            "-a",
            "a",
            "human.md",
            "--description",
            "About the human",
        ],
        &["prompt", "-a", "a", "--fresh"],
    ];
    for args in commands {
        let o = run(d.path(), args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    let log = common::stdout(&run(d.path(), &["memory", "log", "-a", "a"]));
    assert!(log.contains("persona"), "{log}");

    // A repository of someone else's outside any home stays refused.
    let foreign = tempfile::tempdir().unwrap();
    let o = std::process::Command::new("git")
        .args(["init", "-q", "-b", "main"])
        .arg(foreign.path())
        .output()
        .unwrap();
    assert!(o.status.success());
    nix::unistd::chown(
        foreign.path(),
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .unwrap();
    let o = run(
        d.path(),
        &[
            "memory",
            "compile",
            "--memory-dir",
            foreign.path().to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("not owned by current user"),
        "{}",
        stderr(&o)
    );
}

/// Attack 11: a tool child wrote 200 MB into its `tmp/` and made 5,000
/// files on the filesystem every tenant shares. With a quota its agent
/// lives on a volume of its own: the child gets ENOSPC, the other agent's
/// turn and the supervisor's commits go on.
#[test]
fn an_agent_that_fills_its_quota_stops_alone() {
    if !confinement_or_skip("an_agent_that_fills_its_quota_stops_alone") {
        return;
    }
    struct Home(tempfile::TempDir, Vec<String>);
    impl Drop for Home {
        fn drop(&mut self) {
            let _ = run(self.0.path(), &["supervisor", "stop", "--timeout", "5"]);
            let home = mini_letta::paths::Home::at(self.0.path());
            for id in &self.1 {
                let _ = mini_letta::sandbox::volume::unmount(&home, id);
            }
        }
    }
    let dir = common::open_home();
    std::fs::write(
        dir.path().join("config.toml"),
        "[quota]\ndisk_mb = 16\ninodes = 600\n",
    )
    .unwrap();
    let mut h = Home(dir, Vec::new());
    let create = |h: &mut Home, args: &[&str]| {
        let mut all = vec!["agent", "create"];
        all.extend_from_slice(args);
        all.push("--json");
        let o = run(h.0.path(), &all);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        h.1.push(v["id"].as_str().unwrap().to_string());
        v
    };
    let q = create(&mut h, &["q"]);
    assert_eq!(q["quota"], json!({"disk_mb": 16, "inodes": 600}));
    let b = create(&mut h, &["b", "--disk-mb", "32", "--inodes", "2000"]);
    assert_eq!(b["quota"], json!({"disk_mb": 32, "inodes": 2000}));
    let agent_dir = |i: usize| h.0.path().join("agents").join(&h.1[i]);
    for i in 0..2 {
        assert!(mini_letta::sandbox::volume::is_mounted(&agent_dir(i)));
    }
    let fs = nix::sys::statvfs::statvfs(&agent_dir(0)).unwrap();
    let bytes = fs.blocks() as u64 * fs.fragment_size() as u64;
    assert!(bytes <= 16 << 20 && bytes > 12 << 20, "{bytes}");
    assert!(fs.files() <= 600, "{}", fs.files());

    let o = run(h.0.path(), &["supervisor", "start"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Reports go to stdout: the volume has no room left for them.
    let fill = "dd if=/dev/zero of=tmp/big bs=1M count=64 2>&1 | head -1; \
                i=0; while [ $i -lt 2000 ]; do touch tmp/f$i 2>/dev/null || break; i=$((i+1)); done; \
                echo files=$i";
    let o = run(
        h.0.path(),
        &["sandbox", "run", "-a", "q", "--", "sh", "-c", fill],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = common::stdout(&o);
    let tmp = agent_dir(0).join("tmp");
    let big = std::fs::metadata(tmp.join("big"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(big < 16 << 20, "wrote {big} bytes past the quota");
    assert!(out.contains("No space left"), "{out}");
    let files: u64 = out
        .split("files=")
        .nth(1)
        .and_then(|r| r.trim().parse().ok())
        .unwrap();
    assert!(files < 600, "{files} files past the inode quota");

    // The other tenant's turn, with a memory commit, and the supervisor.
    let o = run(h.0.path(), &["chat", "-a", "b", "-p", "记住: likes tea"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let log = common::stdout(&run(h.0.path(), &["memory", "log", "-a", "b"]));
    assert!(log.contains("memory insert"), "{log}");
    let mut c = mini_letta::supervisor::connect(&mini_letta::paths::Home::at(h.0.path())).unwrap();
    let t = Instant::now();
    c.call_json(Call::MemoryStatus {
        agent: Some("q".into()),
    })
    .unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    // The full agent gets a clear error, not a hang.
    let o = run(h.0.path(), &["chat", "-a", "q", "-p", "记住: coffee"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("No space left"), "{}", stderr(&o));
}

/// Attack 12 (smaller): an agent directory stayed `0755 root` until its
/// first confined run. It is private from creation.
#[test]
fn a_new_agent_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let o = run(home.path(), &["agent", "create", "a", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let dir = home.path().join("agents").join(v["id"].as_str().unwrap());
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "{mode:o}");
}

/// `agent delete` is the only way a uid is freed; it also removes the
/// agent's quota volume, and refuses while the agent has running children.
#[test]
fn deleting_an_agent_frees_its_uid_and_volume() {
    if !confinement_or_skip("deleting_an_agent_frees_its_uid_and_volume") {
        return;
    }
    let dir = common::open_home();
    let home = dir.path();
    let id = common::create_agent(home, &["a", "--disk-mb", "8"]);
    let agent_dir = home.join("agents").join(&id);
    assert!(run(home, &["supervisor", "start"]).status.success());
    let mut c = mini_letta::supervisor::connect(&mini_letta::paths::Home::at(home)).unwrap();
    c.call_json(Call::Subscribe {}).unwrap();
    let child = spawn(&mut c, &id, "tool", "strict", None, &["sleep", "30"]);
    let uid =
        serde_json::from_str::<Value>(&read(&agent_dir.join("agent.json"))).unwrap()["sandbox_uid"]
            .as_u64()
            .unwrap();
    let registered = || {
        std::fs::read_to_string(mini_letta::sandbox::identity::REGISTRY)
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with(&format!("{uid} {id} ")))
    };
    assert!(registered());
    let o = run(home, &["agent", "delete", "a"]);
    assert!(
        !o.status.success() && stderr(&o).contains("--yes"),
        "{}",
        stderr(&o)
    );
    let o = run(home, &["agent", "delete", "a", "--yes"]);
    assert!(
        !o.status.success() && stderr(&o).contains("running children"),
        "{}",
        stderr(&o)
    );
    c.call_json(Call::Kill {
        child,
        signal: Some(9),
    })
    .unwrap();
    wait_exit(&mut c, child);
    let o = run(home, &["agent", "delete", "a", "--yes", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["uid_freed"], uid);
    assert_eq!(v["volume_removed"], true);
    assert!(!agent_dir.exists());
    assert!(!registered());
    assert!(!mini_letta::sandbox::volume::is_mounted(&agent_dir));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id), "the volume is still mounted");
    let _ = run(home, &["supervisor", "stop", "--timeout", "5"]);
}

/// Bad quota settings are refused clearly, and nothing is left behind.
#[test]
fn bad_quota_settings_are_refused_clearly() {
    let dir = common::open_home();
    let home = dir.path();
    let o = run(home, &["agent", "create", "tiny", "--disk-mb", "1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("at least 8 MB"), "{}", stderr(&o));
    std::fs::write(home.join("config.toml"), "[quota]\ndisk_gb = 3\n").unwrap();
    let o = run(home, &["agent", "create", "typo"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("config.toml") && err.contains("disk_gb"),
        "{err}"
    );
    let agents = std::fs::read_dir(home.join("agents"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(agents, 0, "a refused agent left files");
}
