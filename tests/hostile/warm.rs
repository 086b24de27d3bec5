//! Warm turn children (issue 38): a child started ahead of an agent's next
//! turn must be exactly as confined as a cold one, never serve another
//! agent, die when its confinement would be planned differently, stay
//! bounded, and leave nothing behind.

use std::path::Path;

use crate::common::{Daemon, confinement_or_skip, run, stderr, stdout, wait_until};

/// A one-shot turn of `agent` with its marks; returns the mark names.
fn timed_turn(home: &Path, agent: &str, text: &str) -> Vec<String> {
    let o = run(
        home,
        &["chat", "-a", agent, "-p", text, "--json", "--timings"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(doc["text"], format!("mock: {text}"), "{doc}");
    doc["timings"]["marks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect()
}

fn handed_over(marks: &[String]) -> bool {
    let has = |n: &str| marks.iter().any(|m| m == n);
    has("sup.handed_over") && has("agent.handover") && !has("stage.start")
}

fn cold(marks: &[String]) -> bool {
    let has = |n: &str| marks.iter().any(|m| m == n);
    has("stage.start") && has("sup.child_planned") && !has("sup.handed_over")
}

/// `(child id, agent id, pid)` of every warm child `ps` shows.
fn warm_children(home: &Path) -> Vec<(u64, String, u32)> {
    let o = run(home, &["ps", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    v["children"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] == "warm")
        .map(|c| {
            (
                c["id"].as_u64().unwrap(),
                c["agent"].as_str().unwrap().to_string(),
                c["pid"].as_u64().unwrap() as u32,
            )
        })
        .collect()
}

/// Wait until `agent` has a parked warm child; returns its pid.
fn parked(home: &Path, agent: &str) -> u32 {
    let mut pid = None;
    assert!(
        wait_until(10, || {
            pid = warm_children(home)
                .into_iter()
                .find(|(_, a, _)| a == agent)
                .map(|(_, _, p)| p);
            pid.is_some()
        }),
        "no warm child for {agent}"
    );
    pid.unwrap()
}

/// Every process below `pid` (its launcher wrappers and the program).
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1))
                .and_then(|s| s.parse::<u32>().ok());
            if ppid == Some(parent) && !all.contains(&p) {
                all.push(p);
            }
        }
        i += 1;
    }
    all
}

/// The agent program's process under a child's launcher, once its stage
/// has confined itself and exec'd it (a warm row is shown from its launch,
/// while the stage may still be setting up).
fn agent_program(pid: u32) -> u32 {
    let find = || {
        descendants(pid).into_iter().find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.contains("mini-letta-agent") && !c.contains("stage2"))
        })
    };
    let mut found = None;
    wait_until(10, || {
        found = find();
        found.is_some()
    });
    found.unwrap_or_else(|| panic!("no agent program below {pid}"))
}

fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

fn ns(pid: u32, kind: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
        .unwrap()
        .display()
        .to_string()
}

fn agent_uid(home: &Path, agent: &str) -> u32 {
    let record = home.join("agents").join(agent).join("agent.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(record).unwrap()).unwrap();
    v["sandbox_uid"].as_u64().unwrap() as u32
}

#[test]
fn the_next_turn_is_handed_to_a_warm_child_confined_before_its_turn() {
    if !confinement_or_skip("warm children") {
        return;
    }
    let d = Daemon::start(&["w"]);
    let home = d.path();
    assert!(
        cold(&timed_turn(home, "w", "first")),
        "the first turn starts a child"
    );
    let pid = parked(home, &d.agents[0]);
    // Parked, before any turn: already the agent's uid, no privileges,
    // seccomp on, and namespaces of its own.
    let program = agent_program(pid);
    let uid = agent_uid(home, &d.agents[0]);
    assert_ne!(uid, 0);
    let uids = status_field(program, "Uid");
    assert!(
        uids.split_whitespace().all(|u| u == uid.to_string()),
        "warm child's uids {uids}, agent's {uid}"
    );
    assert_eq!(status_field(program, "NoNewPrivs"), "1");
    assert_eq!(status_field(program, "Seccomp"), "2");
    assert_eq!(status_field(program, "CapEff"), "0000000000000000");
    let sup = d.pid();
    for kind in ["mnt", "net", "pid", "ipc"] {
        assert_ne!(ns(program, kind), ns(sup, kind), "{kind} namespace shared");
    }
    // The turn goes to it, and answers.
    let marks = timed_turn(home, "w", "second");
    assert!(handed_over(&marks), "{marks:?}");
    assert!(
        crate::common::process_gone(program),
        "a warm child served two turns"
    );
    // The conversation holds both turns, in order.
    let log = home
        .join("agents")
        .join(&d.agents[0])
        .join("conversations/default/messages.jsonl");
    let text = std::fs::read_to_string(log).unwrap();
    let (first, second) = (text.find("mock: first"), text.find("mock: second"));
    assert!(first.is_some() && first < second, "{text}");
    // And the third is handed to a new one.
    parked(home, &d.agents[0]);
    assert!(handed_over(&timed_turn(home, "w", "third")));
}

#[test]
fn a_warm_child_never_serves_another_agents_turn() {
    if !confinement_or_skip("warm children") {
        return;
    }
    let d = Daemon::start(&["a", "b"]);
    let home = d.path();
    timed_turn(home, "a", "for a");
    let a_pid = parked(home, &d.agents[0]);
    // b has no warm child: its turn starts its own, and a's stays parked.
    let marks = timed_turn(home, "b", "for b");
    assert!(
        cold(&marks),
        "b's turn did not start its own child: {marks:?}"
    );
    assert!(
        warm_children(home)
            .iter()
            .any(|(_, agent, pid)| agent == &d.agents[0] && *pid == a_pid),
        "a's warm child was used or lost by b's turn"
    );
    // Each agent's log holds only its own turn.
    for (i, want, other) in [(0, "for a", "for b"), (1, "for b", "for a")] {
        let log = home
            .join("agents")
            .join(&d.agents[i])
            .join("conversations/default/messages.jsonl");
        let text = std::fs::read_to_string(log).unwrap();
        assert!(text.contains(want) && !text.contains(other), "{text}");
    }
}

#[test]
fn a_changed_role_profile_kills_the_warm_child_and_the_next_turn_is_planned_anew() {
    if !confinement_or_skip("warm children") {
        return;
    }
    let d = Daemon::start(&["p"]);
    let home = d.path();
    timed_turn(home, "p", "before");
    let pid = parked(home, &d.agents[0]);
    let profiles = home.join("sandbox-profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let profile =
        include_str!("../../sandbox-profiles/agent.toml").replace("pids = 256", "pids = 200");
    assert!(profile.contains("pids = 200\n"));
    std::fs::write(profiles.join("agent.toml"), profile).unwrap();
    // The sweep kills it within about a second, turn or no turn.
    assert!(
        wait_until(5, || crate::common::process_gone(pid)),
        "a warm child planned under the old profile lives on"
    );
    let marks = timed_turn(home, "p", "after");
    assert!(
        cold(&marks),
        "the turn used a child of the old profile: {marks:?}"
    );
}

#[test]
fn warm_children_are_bounded_in_number_and_in_idle_time() {
    if !confinement_or_skip("warm children") {
        return;
    }
    // One at most: b's evicts a's.
    let d = Daemon::start_with_env(&["a", "b"], &[("MINI_LETTA_WARM_CHILDREN", "1")]);
    let home = d.path();
    timed_turn(home, "a", "one");
    let a_pid = parked(home, &d.agents[0]);
    timed_turn(home, "b", "two");
    parked(home, &d.agents[1]);
    assert!(wait_until(5, || crate::common::process_gone(a_pid)));
    assert_eq!(warm_children(home).len(), 1);
    drop(d);

    // Killed after a second unused.
    let d = Daemon::start_with_env(&["i"], &[("MINI_LETTA_WARM_IDLE_SECS", "1")]);
    timed_turn(d.path(), "i", "idle");
    let pid = parked(d.path(), &d.agents[0]);
    assert!(
        wait_until(6, || crate::common::process_gone(pid)),
        "an idle warm child outlived its limit"
    );
    drop(d);

    // None at all when the limit is 0.
    let d = Daemon::start_with_env(&["n"], &[("MINI_LETTA_WARM_CHILDREN", "0")]);
    timed_turn(d.path(), "n", "none");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(warm_children(d.path()).is_empty());
    assert!(cold(&timed_turn(d.path(), "n", "again")));
}

#[test]
fn deleting_the_agent_or_stopping_the_supervisor_leaves_no_warm_child() {
    if !confinement_or_skip("warm children") {
        return;
    }
    let d = Daemon::start(&["gone", "stays"]);
    let home = d.path();
    timed_turn(home, "gone", "x");
    let gone = parked(home, &d.agents[0]);
    let o = run(home, &["agent", "delete", "gone", "--yes"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(wait_until(5, || crate::common::process_gone(gone)));
    timed_turn(home, "stays", "y");
    let stays = parked(home, &d.agents[1]);
    let uid = agent_uid(home, &d.agents[1]);
    let o = run(home, &["supervisor", "stop"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(wait_until(5, || crate::common::process_gone(stays)));
    // No process of the agent's uid is left.
    let left: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status")).is_ok_and(|s| {
                s.lines().any(|l| {
                    l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string())
                })
            })
        })
        .filter(|p| !crate::common::process_gone(*p))
        .collect();
    assert!(
        left.is_empty(),
        "processes of the agent's uid left: {left:?}"
    );
}

#[test]
fn a_warm_child_killed_while_parked_costs_only_a_cold_start() {
    if !confinement_or_skip("warm children") {
        return;
    }
    let d = Daemon::start(&["k"]);
    let home = d.path();
    timed_turn(home, "k", "one");
    let pid = parked(home, &d.agents[0]);
    let program = agent_program(pid);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(program as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(wait_until(5, || warm_children(home).is_empty()));
    let marks = timed_turn(home, "k", "two");
    assert!(cold(&marks), "{marks:?}");
}
