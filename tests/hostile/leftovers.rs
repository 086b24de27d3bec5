//! Nothing left behind (issue 31 §7): the cgroups of exited children and
//! of dead supervisors, on a cgroup tree every home on the host shares —
//! where another home's live supervisor may be making a group at the very
//! moment one is swept.

use std::path::{Path, PathBuf};

use super::common::*;
use mini_letta::protocol::{Call, SpawnParams, StdioMode};
use serde_json::Value;

/// The cgroup roots children are put under, `None` (skipped loudly) when
/// this host confines without them.
fn cgroup_roots(test: &str) -> Option<Vec<PathBuf>> {
    if !confinement_or_skip(test) {
        return None;
    }
    let o = std::process::Command::new(bin())
        .args(["sandbox", "status", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let roots: Vec<PathBuf> = v["cgroup_info"]["roots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str().map(PathBuf::from))
        .collect();
    if roots.is_empty() {
        skip(&format!("{test}: no cgroup hierarchy here"));
        return None;
    }
    Some(roots)
}

fn spawn(d: &Daemon, argv: &[&str]) -> Result<Value, String> {
    d.client()
        .call_json(Call::Spawn(SpawnParams {
            agent: d.agents[0].clone(),
            role: "tool".into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            stdio: StdioMode::Null,
            workspace: None,
            isolation: None,
            model: None,
        }))
        .map_err(|e| e.to_string())
}

fn child_ended(d: &Daemon, child: u64) -> bool {
    let ps = d.client().call_json(Call::Ps {}).unwrap();
    ps["children"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["id"].as_u64() == Some(child))
        .is_none_or(|r| r["state"] != "running" && r["state"] != "starting")
}

/// A child's groups go when it is reaped, not when its supervisor stops:
/// a long-running supervisor used to keep one group per agent and role
/// it ever ran, and every agent of a deleted home kept its own for good.
#[test]
fn a_reaped_childs_cgroups_go_with_it() {
    let Some(roots) = cgroup_roots("a_reaped_childs_cgroups_go_with_it") else {
        return;
    };
    let d = Daemon::start(&["a"]);
    let agent = d.agents[0].clone();
    let v = spawn(&d, &["sleep", "1"]).unwrap();
    let child = v["child"].as_u64().unwrap();
    assert!(
        roots.iter().all(|r| r.join(&agent).is_dir()),
        "the running child has no group under {roots:?}"
    );
    assert!(wait_until(20, || child_ended(&d, child)));
    for _ in 0..3 {
        let v = spawn(&d, &["true"]).unwrap();
        let c = v["child"].as_u64().unwrap();
        assert!(wait_until(20, || child_ended(&d, c)));
    }
    // The supervisor still runs; nothing of its finished children stays.
    let left = || -> Vec<PathBuf> {
        roots
            .iter()
            .map(|r| r.join(&agent))
            .filter(|p| p.exists())
            .collect()
    };
    assert!(
        wait_until(3, || left().is_empty()),
        "left behind: {:?}",
        left()
    );
}

/// A child is in its own group under every root while it runs (it joins
/// through v1's `tasks` file, not `cgroup.procs`: the move must still be
/// the whole process's, and under every hierarchy's limits).
#[test]
fn a_running_child_is_in_its_group_under_every_root() {
    let Some(roots) = cgroup_roots("a_running_child_is_in_its_group_under_every_root") else {
        return;
    };
    let d = Daemon::start(&["a"]);
    let agent = d.agents[0].clone();
    let v = spawn(&d, &["sh", "-c", "sleep 3 & sleep 3"]).unwrap();
    let pid = v["pid"].as_u64().unwrap().to_string();
    let child = v["child"].as_u64().unwrap();
    // Every process of the child (the shell and what it forked) is listed
    // in one leaf under `<root>/<agent>/tool/` of each hierarchy.
    let members = |root: &Path| -> Vec<String> {
        let role = root.join(&agent).join("tool");
        std::fs::read_dir(&role)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default())
            .collect::<String>()
            .lines()
            .map(str::to_string)
            .collect()
    };
    assert!(
        wait_until(5, || roots.iter().all(|r| members(r).len() >= 2)),
        "not every process of the child is in its groups: {:?}",
        roots.iter().map(|r| (r, members(r))).collect::<Vec<_>>()
    );
    for root in &roots {
        assert!(
            members(root).contains(&pid),
            "child {pid} is not in its group under {}: {:?}",
            root.display(),
            members(root)
        );
    }
    assert!(wait_until(20, || child_ended(&d, child)));
}

/// A child group named after a supervisor: `c<seq>-s<pid>-<start>-n<pidns>`.
fn leaf(pid: u32, started: u64) -> String {
    let ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let ns = ns.to_str().unwrap();
    let ns = &ns["pid:[".len()..ns.len() - 1];
    format!("c1-s{pid}-{started}-n{ns}")
}

fn start_time(pid: u32) -> u64 {
    mini_letta::sandbox::identity::process_start_time(pid).unwrap()
}

/// A supervisor that died (SIGKILL, a crash) leaves its children's groups;
/// the next supervisor to start — of any home — removes them, but never a
/// group whose owner still runs, nor one it cannot tell the owner of.
#[test]
fn a_dead_supervisors_groups_are_swept_at_start_and_no_live_ones() {
    let Some(roots) = cgroup_roots("a_dead_supervisors_groups_are_swept_at_start_and_no_live_ones")
    else {
        return;
    };
    // An owner that has certainly exited, and one that runs (this test).
    let mut gone = std::process::Command::new("sleep")
        .arg("0.1")
        .spawn()
        .unwrap();
    let dead = leaf(gone.id(), start_time(gone.id()));
    gone.wait().unwrap();
    let live = leaf(std::process::id(), start_time(std::process::id()));
    let tag = format!("agent-leftover-{}", std::process::id());
    let (dead_agent, live_agent, unnamed) = (
        format!("{tag}-dead"),
        format!("{tag}-live"),
        format!("{tag}-unnamed"),
    );
    let planted = |root: &Path| {
        [
            root.join(&dead_agent).join("tool").join(&dead),
            root.join(&live_agent).join("tool").join(&live),
            root.join(&unnamed).join("tool"),
        ]
    };
    for root in &roots {
        for dir in planted(root) {
            std::fs::create_dir_all(&dir).unwrap();
        }
    }
    let d = Daemon::start(&["a"]);
    let mut kept = Vec::new();
    for root in &roots {
        let [dead_dir, live_dir, unnamed_dir] = planted(root);
        kept.push((dead_dir.exists(), live_dir.is_dir(), unnamed_dir.is_dir()));
        // Clean up what the test made, whatever the outcome.
        for dir in [&live_dir, &dead_dir] {
            let _ = std::fs::remove_dir(dir);
        }
        for agent in [&dead_agent, &live_agent, &unnamed] {
            let _ = std::fs::remove_dir(root.join(agent).join("tool"));
            let _ = std::fs::remove_dir(root.join(agent));
        }
    }
    drop(d);
    for (root, (dead_left, live_kept, unnamed_kept)) in roots.iter().zip(kept) {
        assert!(
            !dead_left,
            "{}: a dead supervisor's group stayed",
            root.display()
        );
        assert!(
            live_kept,
            "{}: a live supervisor's group was removed",
            root.display()
        );
        assert!(
            unnamed_kept,
            "{}: a group of unknown owner was removed",
            root.display()
        );
    }
}

/// A sweep that empties an agent's role group while a live supervisor is
/// launching a child of that agent and role must not make the launch fail:
/// the launcher makes the group again.
#[test]
fn a_sweep_never_fails_a_live_supervisors_launch() {
    let Some(roots) = cgroup_roots("a_sweep_never_fails_a_live_supervisors_launch") else {
        return;
    };
    let d = Daemon::start(&["a"]);
    let agent = d.agents[0].clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let launches = {
        let (home, stop) = (d.path().to_path_buf(), stop.clone());
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let o = run(&home, &["sandbox", "run", "-a", "a", "--", "true"]);
                n += 1;
                if !o.status.success() {
                    failures.push(stderr(&o));
                }
            }
            (n, failures)
        })
    };
    for _ in 0..4 {
        // A dead owner's group under the live agent's role: the other
        // supervisor's sweep removes it, and the role group with it when
        // it is empty.
        let mut gone = std::process::Command::new("sleep")
            .arg("0.05")
            .spawn()
            .unwrap();
        let dead = leaf(gone.id(), start_time(gone.id()));
        gone.wait().unwrap();
        for root in &roots {
            let _ = std::fs::create_dir_all(root.join(&agent).join("tool").join(&dead));
        }
        let other = Daemon::start(&["b"]);
        drop(other);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (n, failures) = launches.join().unwrap();
    assert!(n > 0);
    assert!(
        failures.is_empty(),
        "{} of {n} launches failed: {failures:?}",
        failures.len()
    );
}

/// `last-request.json` of every conversation of `agent` under `home`.
fn last_requests(home: &Path, agent: &str) -> Vec<PathBuf> {
    let convs = home.join("agents").join(agent).join("conversations");
    std::fs::read_dir(convs)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("last-request.json"))
        .filter(|p| p.exists())
        .collect()
}

/// What the model was last sent is kept for operators, but bounded: a long
/// conversation used to rewrite a file as large as its whole context on
/// every request (hundreds of kilobytes at a big window).
#[test]
fn last_request_json_is_bounded_in_size() {
    let home = open_home();
    let id = create_agent(home.path(), &["big", "--context-window", "2000000"]);
    let chunk = "word ".repeat(20_000);
    let prompt = home.path().join("prompt.txt");
    for i in 0..4 {
        std::fs::write(&prompt, format!("part {i}: {chunk}")).unwrap();
        let file = prompt.to_str().unwrap();
        let o = run(home.path(), &["chat", "-a", "big", "--prompt-file", file]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = run(home.path(), &["chat", "-a", "big", "-p", "the last words"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let path = home
        .path()
        .join("agents")
        .join(&id)
        .join("conversations/default/last-request.json");
    let bytes = std::fs::read(&path).unwrap();
    let cap = mini_letta::store::conversation::LAST_REQUEST_MAX_BYTES;
    assert!(bytes.len() <= cap, "{} bytes > {cap}", bytes.len());
    // Still JSON an operator can read: the newest message is there, and
    // it says what was left out.
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(v.to_string().contains("the last words"), "{v}");
    assert!(
        v["truncated"]["omitted_messages"].as_u64().unwrap() > 0,
        "{}",
        v["truncated"]
    );
    assert!(v["truncated"]["bytes"].as_u64().unwrap() > cap as u64);
}

/// ... and bounded in number: one file per conversation ever used grew
/// without end; only the most recent conversations keep theirs.
#[test]
fn last_request_json_is_bounded_in_count() {
    let home = open_home();
    let id = create_agent(home.path(), &["many"]);
    let keep = mini_letta::store::conversation::LAST_REQUEST_MAX_FILES;
    let n = keep + 3;
    for i in 0..n {
        let o = run(
            home.path(),
            &[
                "chat",
                "-a",
                "many",
                "--conversation",
                &format!("c{i}"),
                "-p",
                "hi",
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let kept = last_requests(home.path(), &id);
    assert_eq!(kept.len(), keep, "{kept:?}");
    // The newest ones, the one just used among them.
    let newest = home
        .path()
        .join("agents")
        .join(&id)
        .join(format!("conversations/c{}/last-request.json", n - 1));
    assert!(kept.contains(&newest), "{kept:?}");
    let oldest = newest
        .to_string_lossy()
        .replace(&format!("c{}", n - 1), "c0");
    assert!(!kept.contains(&PathBuf::from(oldest)), "{kept:?}");
}
