//! Confinement with real confined children, at the full level (L0) and with
//! namespaces switched off (L2: uid + landlock + seccomp), plus strict mode
//! refusing when a needed layer is missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{bin, stderr, stdout};
use serde_json::Value;

/// `sandbox status --json`, with more environment for the prober.
fn status_json(env: &[(&str, &str)]) -> Value {
    let o = Command::new(bin())
        .args(["sandbox", "status", "--json"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// Skip (loudly) unless this host can confine at all.
fn require_layers() -> bool {
    let v = status_json(&[]);
    if v["landlock"]["available"] != true || v["seccomp"]["available"] != true {
        common::skip_or_fail(&format!(
            "this kernel lacks landlock or seccomp: {}",
            v["missing"]
        ));
        return false;
    }
    if !nix::unistd::geteuid().is_root() {
        common::skip_or_fail("confinement tests need root to switch agent uids");
        return false;
    }
    true
}

struct Home {
    dir: tempfile::TempDir,
    a: String,
    b: String,
}

fn home_with_two_agents() -> Home {
    let dir = tempfile::tempdir().unwrap();
    let mut ids = Vec::new();
    for name in ["alice", "bob"] {
        let o = common::run(dir.path(), &["agent", "create", name, "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        ids.push(
            serde_json::from_str::<Value>(&stdout(&o)).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let b = ids.pop().unwrap();
    let a = ids.pop().unwrap();
    let h = Home { dir, a, b };
    std::fs::write(h.agent_dir(&h.b).join("memory/secret.md"), "BOB-SECRET\n").unwrap();
    h
}

impl Home {
    fn agent_dir(&self, id: &str) -> std::path::PathBuf {
        self.dir.path().join("agents").join(id)
    }

    /// `sandbox run` of `sh -c script` as agent A in `role`, with more
    /// environment for the supervisor (a namespace backend, layers off).
    fn run_role(&self, role: &str, env: &[(&str, &str)], script: &str) -> Output {
        let mut cmd = Command::new(bin());
        cmd.args([
            "sandbox", "run", "-a", "alice", "--role", role, "--", "sh", "-c", script,
        ])
        .env("MINI_LETTA_HOME", self.dir.path())
        .env_remove("MINI_LETTA_SANDBOX_DISABLE")
        .env_remove("MINI_LETTA_NAMESPACES")
        .envs(env.iter().copied());
        cmd.output().unwrap()
    }

    /// `sandbox run` as agent A with an embedded supervisor.
    fn run_as_a(&self, level_env: Option<&str>, isolation: &str, script: &str) -> Output {
        self.run_as_a_with(level_env, isolation, script, &[])
    }

    /// As [`Home::run_as_a`], with more environment for the supervisor.
    fn run_as_a_with(
        &self,
        level_env: Option<&str>,
        isolation: &str,
        script: &str,
        env: &[(&str, &str)],
    ) -> Output {
        let mut cmd = Command::new(bin());
        cmd.envs(env.iter().copied());
        cmd.args([
            "sandbox",
            "run",
            "-a",
            "alice",
            "--role",
            "tool",
            "--isolation",
            isolation,
            "--",
            "sh",
            "-c",
            script,
        ])
        .env("MINI_LETTA_HOME", self.dir.path())
        .env("OPENAI_API_KEY", "sk-test-secret-in-supervisor");
        match level_env {
            Some(v) => cmd.env("MINI_LETTA_SANDBOX_DISABLE", v),
            None => cmd.env_remove("MINI_LETTA_SANDBOX_DISABLE"),
        };
        cmd.output().unwrap()
    }
}

/// Each line `name=rc` from a script that tries things and records `$?`.
fn results(o: &Output) -> std::collections::BTreeMap<String, String> {
    stdout(o)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn attack_script(h: &Home) -> String {
    let b = h.agent_dir(&h.b);
    let a = h.agent_dir(&h.a);
    let agents = h.dir.path().join("agents");
    let git = a.join("memory.git");
    format!(
        r#"
cd {a}
cat {b}/memory/secret.md >/dev/null 2>&1; echo read_other=$?
ls {b} >/dev/null 2>&1; echo list_other=$?
echo x > {b}/memory/pwned 2>/dev/null; echo write_other=$?
ln {b}/memory/secret.md {a}/memory/l 2>/dev/null; echo link_other=$?
mv {a}/memory/human.md {b}/memory/h 2>/dev/null; echo rename_into_other=$?
n=$(ls {agents} 2>/dev/null | wc -l); echo agents_visible=$n
if cat /proc/$PPID/environ /proc/1/environ 2>/dev/null | tr '\0' '\n' | grep -q sk-test-secret; then echo environ_leak=1; else echo environ_leak=0; fi
if env | grep -q sk-test-secret; then echo env_leak=1; else echo env_leak=0; fi
echo '#!/bin/sh' > {git}/hooks/post-merge 2>/dev/null; echo write_hook=$?
echo '[core]' >> {git}/config 2>/dev/null; echo write_config=$?
echo hello > {a}/memory/ok.md; echo write_own=$?
cat {a}/memory/persona.md >/dev/null; echo read_own=$?
echo x > /etc/mini-letta-probe 2>/dev/null; echo write_etc=$?
grep -q '^NoNewPrivs:[[:space:]]*1' /proc/self/status; echo nnp=$?
grep -q '^Seccomp:[[:space:]]*2' /proc/self/status; echo seccomp=$?
grep '^CapEff' /proc/self/status | grep -q '0000000000000000'; echo caps_zero=$?
echo uid=$(id -u)
"#,
        a = a.display(),
        b = b.display(),
        agents = agents.display(),
        git = git.display()
    )
}

fn assert_contained(h: &Home, o: &Output, level: &str) {
    assert!(o.status.success(), "[{level}] {}\n{}", stderr(o), stdout(o));
    let r = results(o);
    let fail = |k: &str| r.get(k).map(|v| v != "0").unwrap_or(false);
    for k in [
        "read_other",
        "list_other",
        "write_other",
        "link_other",
        "rename_into_other",
        "write_hook",
        "write_config",
        "write_etc",
    ] {
        assert!(fail(k), "[{level}] {k} should fail: {r:?}");
    }
    for k in ["write_own", "read_own", "nnp", "seccomp", "caps_zero"] {
        assert_eq!(
            r.get(k).map(String::as_str),
            Some("0"),
            "[{level}] {k}: {r:?}"
        );
    }
    assert!(
        r["agents_visible"] == "0" || r["agents_visible"] == "1",
        "[{level}] {r:?}"
    );
    assert_ne!(r["uid"], "0", "[{level}] runs as the agent's own uid");
    assert_eq!(
        r.get("environ_leak").map(String::as_str),
        Some("0"),
        "[{level}] supervisor environ leaked: {r:?}"
    );
    assert_eq!(
        r.get("env_leak").map(String::as_str),
        Some("0"),
        "[{level}] env leaked: {r:?}"
    );
    // From outside: B untouched, A's write landed.
    assert_eq!(
        std::fs::read_to_string(h.agent_dir(&h.b).join("memory/secret.md")).unwrap(),
        "BOB-SECRET\n"
    );
    assert!(!h.agent_dir(&h.b).join("memory/pwned").exists());
    assert!(
        !h.agent_dir(&h.a)
            .join("memory.git/hooks/post-merge")
            .exists()
    );
    assert!(!Path::new("/etc/mini-letta-probe").exists());
}

#[test]
fn full_level_contains_agent_a() {
    if !require_layers() {
        return;
    }
    let h = home_with_two_agents();
    let o = h.run_as_a(None, "strict", &attack_script(&h));
    assert_contained(&h, &o, "L0");
}

/// The default namespace backend is the native one; bubblewrap, on request,
/// contains agent A just as well (both build the same view).
#[test]
fn both_namespace_backends_contain_agent_a() {
    if !require_layers() {
        return;
    }
    let backend = |env: &[(&str, &str)]| status_json(env)["ns_backend"].clone();
    if backend(&[]) != "native" {
        common::skip_or_fail(&format!(
            "native namespaces unavailable here: {}",
            backend(&[])
        ));
        return;
    }
    let h = home_with_two_agents();
    let bwrap = [("MINI_LETTA_NAMESPACES", "bwrap")];
    if backend(&bwrap) != "bwrap" {
        common::skip_or_fail("bubblewrap backend unavailable here");
        return;
    }
    let o = h.run_as_a_with(None, "strict", &attack_script(&h), &bwrap);
    assert_contained(&h, &o, "L0");
    // The same view: the home is masked, the agent's directory is there.
    let probe = format!(
        "test -d {a} && echo own=0; ls {home}/agents | wc -l",
        a = h.agent_dir(&h.a).display(),
        home = h.dir.path().display()
    );
    let native = h.run_as_a(None, "strict", &probe);
    let wrapped = h.run_as_a_with(None, "strict", &probe, &bwrap);
    assert_eq!(stdout(&native), stdout(&wrapped), "{}", stderr(&native));
    assert!(
        stdout(&native).starts_with("own=0\n"),
        "{}",
        stdout(&native)
    );
}

#[test]
fn degraded_level_without_namespaces_still_contains_agent_a() {
    if !require_layers() {
        return;
    }
    let h = home_with_two_agents();
    let o = h.run_as_a(Some("namespaces"), "strict", &attack_script(&h));
    assert_contained(&h, &o, "L2");
}

#[test]
fn no_tcp_egress_and_no_signals_out() {
    if !require_layers() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let h = home_with_two_agents();
    for level in [None, Some("namespaces")] {
        let script = format!(
            "(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; echo tcp=$?; kill -0 {pid} 2>/dev/null; echo signal=$?",
            pid = sleeper.id()
        );
        let o = h.run_as_a(level, "strict", &format!("exec bash -c '{script}'"));
        let r = results(&o);
        assert_ne!(
            r.get("tcp").map(String::as_str),
            Some("0"),
            "{level:?}: {r:?} {}",
            stderr(&o)
        );
        assert_ne!(
            r.get("signal").map(String::as_str),
            Some("0"),
            "{level:?}: {r:?}"
        );
        assert!(r.contains_key("tcp"), "{level:?}: {}", stderr(&o));
    }
    sleeper.kill().unwrap();
    let _ = sleeper.wait();
}

#[test]
fn fork_bomb_stops_at_the_pids_limit() {
    if !require_layers() {
        return;
    }
    let h = home_with_two_agents();
    // The tool profile allows 128 pids; try 400 sleeping children.
    // dash exits when a fork fails, so the last line printed is the count.
    let script =
        "n=0; for i in $(seq 1 400); do sleep 3 & n=$((n+1)); echo started=$n; done; echo done=1";
    let o = h.run_as_a(None, "strict", script);
    let r = results(&o);
    let n: u32 = r.get("started").and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(
        n > 10,
        "the shell could not start anything: {r:?} {}",
        stderr(&o)
    );
    assert!(
        n < 400 && !r.contains_key("done"),
        "fork bomb was not stopped: {r:?}"
    );
}

#[test]
fn strict_refuses_without_landlock_and_degraded_accepts() {
    if !require_layers() {
        return;
    }
    let h = home_with_two_agents();
    let o = h.run_as_a(Some("landlock,namespaces"), "strict", "echo ran");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("isolation Strict needs level L0 or L2"),
        "{}",
        stderr(&o)
    );
    assert!(!stdout(&o).contains("ran"));
    let o = h.run_as_a(Some("landlock,namespaces"), "degraded", "echo ran; id -u");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("ran\n"));
    assert!(!stdout(&o).contains("\n0\n"), "degraded still switches uid");
}

/// A child's per-agent cgroups do not outlive its supervisor.
#[test]
fn agent_cgroups_are_removed_when_the_supervisor_stops() {
    let Some(roots) = layers_and_cgroups() else {
        return;
    };
    let h = home_with_two_agents();
    // While it runs, the child's agent has its groups (the child itself
    // sees only its own cgroup namespace).
    let mut run = Command::new(bin())
        .args(["sandbox", "run", "-a", "alice", "--", "sleep", "2"])
        .env("MINI_LETTA_HOME", h.dir.path())
        .env_remove("MINI_LETTA_SANDBOX_DISABLE")
        .spawn()
        .unwrap();
    let seen = common::wait_until(10, || roots.iter().all(|r| r.join(&h.a).is_dir()));
    assert!(run.wait().unwrap().success());
    assert!(seen, "the child's groups never appeared under {roots:?}");
    // The embedded supervisor has stopped: the groups are gone.
    for root in &roots {
        assert!(
            !root.join(&h.a).exists(),
            "{} left behind",
            root.join(&h.a).display()
        );
    }
}

/// A child stopped (`SIGSTOP`) when its supervisor stops ignores the
/// request to finish and is killed after the grace: its groups still go
/// with the supervisor, not only those of children that ended in time.
/// (A fault soak left an agent's groups behind when a stopped child was
/// killed at the stop and the sweep ran before its processes were gone.)
#[test]
fn a_stopped_childs_cgroups_go_when_the_supervisor_stops() {
    let Some(roots) = layers_and_cgroups() else {
        return;
    };
    let h = home_with_two_agents();
    let o = common::run(h.dir.path(), &["supervisor", "start"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut run = Command::new(bin())
        .args(["sandbox", "run", "-a", "alice", "--", "sleep", "60"])
        .env("MINI_LETTA_HOME", h.dir.path())
        .env_remove("MINI_LETTA_SANDBOX_DISABLE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Every process of the child's groups, once its sleep has started.
    let procs = || -> Vec<i32> {
        let mut pids = Vec::new();
        for root in &roots {
            for f in files_named(&root.join(&h.a), "cgroup.procs") {
                let text = std::fs::read_to_string(&f).unwrap_or_default();
                pids.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    };
    let running = common::wait_until(10, || {
        procs().iter().any(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep")
        })
    });
    assert!(
        running,
        "the child's sleep never ran in its groups under {roots:?}"
    );
    let stopped: Vec<(i32, String)> = procs()
        .into_iter()
        .filter_map(|p| Some((p, std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?)))
        .collect();
    for (pid, _) in &stopped {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGSTOP,
        );
    }
    let o = common::run(h.dir.path(), &["supervisor", "stop", "--timeout", "20"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = run.kill();
    let _ = run.wait();
    // Reaped, by their own launcher: none is left a zombie for the host's
    // init, whose reaping may come late (and its pids group with it).
    for (pid, stat) in &stopped {
        let start = |s: &str| {
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(19).map(str::to_string))
        };
        let now = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            now.is_empty() || start(&now) != start(stat),
            "process {pid} of the child outlived its supervisor's stop: {now}"
        );
    }
    for root in &roots {
        assert!(
            !root.join(&h.a).exists(),
            "{} left behind after the stop: {:?}",
            root.join(&h.a).display(),
            files_named(&root.join(&h.a), "cgroup.procs")
        );
    }
}

/// The cgroup roots, where every layer is there and there are some; else
/// `None`, said (or failed, where the sandbox is required).
fn layers_and_cgroups() -> Option<Vec<std::path::PathBuf>> {
    if !require_layers() {
        return None;
    }
    let roots = cgroup_roots();
    if roots.is_empty() {
        common::skip_or_fail("no cgroup hierarchy here");
        return None;
    }
    Some(roots)
}

/// The cgroup roots `sandbox status` reports (none where there are none).
fn cgroup_roots() -> Vec<std::path::PathBuf> {
    let v = status_json(&[]);
    v["cgroup_info"]["roots"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|p| p.as_str())
                .map(Into::into)
                .collect()
        })
        .unwrap_or_default()
}

/// The files called `name` anywhere under `dir`.
fn files_named(dir: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else if e.file_name() == name {
                found.push(e.path());
            }
        }
    }
    found
}

/// A tenant's CPU bandwidth is held to its profile's `cpu_percent` (one
/// core by default) where the cpu controller is there.
#[test]
fn a_childs_cpu_bandwidth_is_limited() {
    if !require_layers() {
        return;
    }
    let v = status_json(&[]);
    let roots: Vec<std::path::PathBuf> = v["cgroup_info"]["roots"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|p| p.as_str())
                .map(Into::into)
                .collect()
        })
        .unwrap_or_default();
    let version = v["cgroup_info"]["version"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let (file, want) = match version.as_str() {
        "v1" => match roots.iter().find(|r| r.starts_with("/sys/fs/cgroup/cpu")) {
            Some(r) => (r.clone(), "cpu.cfs_quota_us"),
            None => {
                common::skip_or_fail("cgroup v1 without the cpu controller: no CPU limit");
                return;
            }
        },
        "v2" => match roots.first() {
            Some(r) => (r.clone(), "cpu.max"),
            None => return common::skip_or_fail("no cgroup root"),
        },
        other => return common::skip_or_fail(&format!("no cgroup hierarchy: {other}")),
    };
    let h = home_with_two_agents();
    let mut run = Command::new(bin())
        .args(["sandbox", "run", "-a", "alice", "--", "sleep", "2"])
        .env("MINI_LETTA_HOME", h.dir.path())
        .env_remove("MINI_LETTA_SANDBOX_DISABLE")
        .spawn()
        .unwrap();
    let path = file.join(&h.a).join("tool").join(want);
    let mut seen = String::new();
    common::wait_until(10, || {
        seen = std::fs::read_to_string(&path).unwrap_or_default();
        !seen.is_empty()
    });
    assert!(run.wait().unwrap().success());
    let expected = if version == "v1" {
        "100000"
    } else {
        "100000 100000"
    };
    if version == "v2" && seen.is_empty() {
        return common::skip_or_fail("cgroup v2 without the cpu controller enabled");
    }
    assert_eq!(seen.trim(), expected, "{}", path.display());
}

#[test]
fn status_reports_what_a_confined_child_sees() {
    if !require_layers() {
        return;
    }
    let v = status_json(&[]);
    assert_eq!(
        v["landlock_abi"].as_i64().unwrap(),
        mini_letta::sandbox::report::landlock_abi() as i64
    );
    let h = home_with_two_agents();
    let o = h.run_as_a(
        None,
        "strict",
        "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status",
    );
    let s = stdout(&o);
    assert!(s.contains("NoNewPrivs:\t1"), "{s}");
    assert!(s.contains("Seccomp:\t2"), "{s}");
    let level = v["level"].as_str().unwrap();
    if v["namespaces"]["available"] == true {
        assert_eq!(level, "L0");
        // A pid namespace: the child sees only its own few processes.
        let o = h.run_as_a(None, "strict", "ls /proc | grep -c '^[0-9]'");
        let n: u32 = stdout(&o).trim().parse().unwrap();
        assert!(n < 10, "{n} pids visible");
    } else {
        assert_eq!(level, "L2");
    }
}

#[test]
fn child_dies_with_the_supervisor() {
    if !require_layers() {
        return;
    }
    let d = common::Daemon::start(&["a"]);
    let mut c = d.client();
    let v = spawn_strict(&mut c, &d.agents[0], &["sleep", "1000"]);
    let pid = v["pid"].as_u64().unwrap() as u32;
    let child = v["child"].as_u64().unwrap();
    // An established child (its stage 2 said hello): the namespace init
    // (or bubblewrap) has armed its own parent-death signal by then.
    assert!(common::wait_until(10, || {
        let ps = d
            .client()
            .call_json(mini_letta::protocol::Call::Ps {})
            .unwrap();
        ps["children"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"].as_u64() == Some(child) && r["state"] == "running")
    }));
    let sup = d.pid();
    // Every process of the sandbox: the launched one and its descendants.
    let tree = descendants(pid);
    assert!(!tree.is_empty());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for p in tree {
        assert!(
            common::wait_until(5, || common::process_gone(p)),
            "sandbox process {p} survived"
        );
    }
}

fn descendants(pid: u32) -> Vec<u32> {
    mini_letta::sandbox::proc_tree::process_tree(pid)
}

#[test]
fn sigterm_reaches_the_confined_program() {
    if !require_layers() {
        return;
    }
    let d = common::Daemon::start(&["a"]);
    let mut c = d.client();
    c.call_json(mini_letta::protocol::Call::Subscribe {})
        .unwrap();
    let v = spawn_strict(
        &mut c,
        &d.agents[0],
        &[
            "sh",
            "-c",
            "trap 'exit 42' TERM; : > \"$TMPDIR/trap-set\"; while true; do sleep 0.1; done",
        ],
    );
    let child = v["child"].as_u64().unwrap();
    // The signal is sent once the trap is in place, not after a guess.
    let ready = mini_letta::paths::Home::at(d.path())
        .agent(&d.agents[0])
        .unwrap()
        .tmp_dir()
        .join("trap-set");
    assert!(
        common::wait_until(10, || ready.exists()),
        "the program never set its trap ({})",
        ready.display()
    );
    c.call_json(mini_letta::protocol::Call::Kill {
        child,
        signal: None,
    })
    .unwrap();
    let exit = loop {
        if let mini_letta::protocol::ServerFrame::Event(mini_letta::protocol::Event::ChildExit(
            exit,
        )) = c.read_frame().unwrap()
            && exit.child == child
        {
            break serde_json::to_value(exit).unwrap();
        }
    };
    assert_eq!(exit["state"], "exited", "{exit}");
    assert_eq!(exit["code"], 42, "the program's TERM handler ran: {exit}");
}

#[test]
fn a_new_supervisor_kills_leftovers_of_its_agents() {
    if !require_layers() {
        return;
    }
    let d = common::Daemon::start(&["a"]);
    let mut c = d.client();
    let v = spawn_strict(&mut c, &d.agents[0], &["sleep", "1000"]);
    let pid = v["pid"].as_u64().unwrap() as u32;
    // Plant a leftover: a process of the agent's uid that no supervisor owns.
    let uid = std::fs::metadata(format!("/proc/{pid}"))
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap();
    let mut stray = std::process::Command::new("sleep");
    stray.arg("1000");
    std::os::unix::process::CommandExt::uid(&mut stray, uid);
    let mut stray = stray.spawn().unwrap();
    let stray_pid = stray.id();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let o = common::run(d.path(), &["supervisor", "start"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = stray.wait();
    assert!(
        common::wait_until(5, || common::process_gone(stray_pid)),
        "the leftover survived a new start"
    );
}

/// Start a strictly confined `tool` child of `agent` running `argv`.
fn spawn_strict(c: &mut mini_letta::protocol::client::Client, agent: &str, argv: &[&str]) -> Value {
    c.call_json(mini_letta::protocol::Call::Spawn(
        mini_letta::protocol::SpawnParams {
            agent: agent.to_string(),
            role: "tool".into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            stdio: mini_letta::protocol::StdioMode::Null,
            workspace: None,
            isolation: None,
            model: None,
        },
    ))
    .unwrap()
}

/// A home below a directory agent uids cannot traverse (`~/.mini-letta`
/// under a 0700 `/root`) is refused with the reason and the fix, not with
/// a confusing failure inside the child stage.
#[test]
fn a_home_agent_uids_cannot_reach_is_refused_clearly() {
    use std::os::unix::fs::PermissionsExt;
    if !require_layers() {
        return;
    }
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let home = private.path().join("home");
    let o = common::run(&home, &["agent", "create", "alice"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = common::run(&home, &["sandbox", "run", "-a", "alice", "--", "true"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("agent uids cannot reach the home"), "{err}");
    assert!(
        err.contains(&format!("{} is not searchable", private.path().display())),
        "{err}"
    );
}

/// The child stage program installed where agent uids cannot reach it (as
/// `cargo install` does under a 0700 `/root`) is refused with the reason.
#[test]
fn a_stage_program_agent_uids_cannot_run_is_refused_clearly() {
    use std::os::unix::fs::PermissionsExt;
    if !require_layers() {
        return;
    }
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let bin_dir = private.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    for exe in [
        bin(),
        env!("CARGO_BIN_EXE_mini-letta-stage2").into(),
        env!("CARGO_BIN_EXE_mini-letta-agent").into(),
    ] {
        std::fs::copy(&exe, bin_dir.join(exe.file_name().unwrap())).unwrap();
    }
    let h = home_with_two_agents();
    let o = Command::new(bin_dir.join("mini-letta"))
        .args(["sandbox", "run", "-a", "alice", "--", "true"])
        .env("MINI_LETTA_HOME", h.dir.path())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("agent uids cannot run"), "{err}");
    assert!(
        err.contains(&format!("{} is not searchable", private.path().display())),
        "{err}"
    );
}

/// The seccomp allow-list must not break real tools: in every role, at the
/// full level (both namespace backends) and without namespaces, a shell
/// pipeline of coreutils, a git
/// repository made and committed to with the git CLI, and python3 (when
/// installed) with threads and a subprocess all work in `$AGENT/tmp`, while
/// the filter is on (`Seccomp: 2`).
/// The levels a program is tried under: native namespaces, none (L2),
/// and bubblewrap's where it works (said loudly where it does not).
fn levels(what: &str) -> Vec<(&'static str, &'static [(&'static str, &'static str)])> {
    const BWRAP: &[(&str, &str)] = &[("MINI_LETTA_NAMESPACES", "bwrap")];
    let mut levels: Vec<(&str, &[(&str, &str)])> = vec![
        ("L0 native", &[]),
        ("L2", &[("MINI_LETTA_SANDBOX_DISABLE", "namespaces")]),
    ];
    if status_json(BWRAP)["ns_backend"] == "bwrap" {
        levels.push(("L0 bwrap", BWRAP));
    } else {
        common::skip_or_fail(&format!(
            "bubblewrap backend unavailable: {what} not tried under it"
        ));
    }
    levels
}

#[test]
fn real_tools_work_under_every_role() {
    if !require_layers() {
        return;
    }
    let h = home_with_two_agents();
    let tmp = h.agent_dir(&h.a).join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let script = format!(
        r#"
set -e
grep -q '^Seccomp:[[:space:]]*2' /proc/self/status && echo seccomp=on
cd {tmp}
rm -rf repo && mkdir repo && cd repo
git init -q .
printf 'hello world\nsecond line\n' > notes.md
git add notes.md
git -c user.name=Test -c user.email=test@example.invalid commit -q -m first
echo commits=$(git log --oneline | wc -l)
echo status=$(git status --porcelain | wc -l)
git -c user.name=Test -c user.email=test@example.invalid commit -q --allow-empty -m second
echo revs=$(git rev-list --count HEAD)
echo pipeline=$(cat notes.md | tr 'a-z' 'A-Z' | grep -c HELLO)
echo sorted=$(seq 1 200 | sort -rn | head -1)
cp notes.md copy.md && mv copy.md moved.md && chmod 600 moved.md && echo mode=$(stat -c %a moved.md)
ln -s moved.md link.md && echo link=$(readlink link.md)
mkfifo fifo && rm fifo && echo fifo=ok
touch -d '2020-01-01' moved.md && echo year=$(date -r moved.md +%Y)
echo words=$(wc -w < notes.md)
timeout 5 sleep 0.05 && echo timeout=ok
echo sum=$(sha256sum notes.md | cut -c1-8)
du -s . >/dev/null && df . >/dev/null && echo disk=ok
(echo sub; echo shell) | sed -n 2p
if command -v python3 >/dev/null; then
  python3 -c 'import subprocess, threading, tempfile, os
t = threading.Thread(target=lambda: None); t.start(); t.join()
with tempfile.TemporaryDirectory(dir=".") as d:
    open(os.path.join(d, "f"), "w").write("x")
print("python=" + subprocess.run(["echo", "ok"], capture_output=True, text=True).stdout.strip())'
else
  echo python=absent
fi
echo done=1
"#,
        tmp = tmp.display()
    );
    for (level, env) in levels("real tools") {
        for role in ["agent", "tool", "memory-worker", "reflection"] {
            let o = h.run_role(role, env, &script);
            let r = results(&o);
            let ctx = format!("{role} {level}: {}\n{}", stdout(&o), stderr(&o));
            assert!(o.status.success(), "{ctx}");
            for (k, v) in [
                ("seccomp", "on"),
                ("commits", "1"),
                ("status", "0"),
                ("revs", "2"),
                ("pipeline", "1"),
                ("sorted", "200"),
                ("mode", "600"),
                ("link", "moved.md"),
                ("fifo", "ok"),
                ("year", "2020"),
                ("words", "4"),
                ("timeout", "ok"),
                ("disk", "ok"),
                ("done", "1"),
            ] {
                assert_eq!(r.get(k).map(String::as_str), Some(v), "{k}: {ctx}");
            }
            assert!(stdout(&o).contains("\nshell\n"), "{ctx}");
            let py = r.get("python").map(String::as_str);
            assert!(py == Some("ok") || py == Some("absent"), "{ctx}");
        }
    }
}

/// `make` runs its recipes through `posix_spawn` with
/// `POSIX_SPAWN_RESETIDS`, whose child sets its effective ids back to the
/// real ones (`setresuid(-1, uid, -1)`): refused, every recipe failed
/// "Function not implemented" (issue 48, a help example). A tool command
/// may set its ids to the ones it has; to any other id it still may not,
/// having no capability to.
#[test]
fn a_tool_command_runs_make_and_cannot_change_its_ids() {
    if !require_layers() {
        return;
    }
    if !common::tool_present("make") {
        return;
    }
    let h = home_with_two_agents();
    let tmp = h.agent_dir(&h.a).join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("Makefile"), "test:\n\t@echo recipe=ran\n").unwrap();
    let script = format!(
        r#"
cd {tmp}
make test
echo make=$?
if command -v python3 >/dev/null; then
  python3 -c 'import os
u = os.getuid(); g = os.getgid()
os.setresuid(-1, u, -1); os.setresgid(-1, g, -1); os.setreuid(u, u); os.setuid(u)
print("same=ok")
for name, call in (("uid", lambda: os.setresuid(0, 0, 0)), ("gid", lambda: os.setresgid(0, 0, 0)),
                   ("reuid", lambda: os.setreuid(u + 1, u + 1)), ("groups", lambda: os.setgroups([0]))):
    try:
        call(); print(name + "=changed")
    except OSError as e:
        print(name + "=refused")
print("ids=" + str(os.getresuid()) + str(os.getresgid()))'
fi
"#,
        tmp = tmp.display()
    );
    let python = common::tool_present("python3");
    for (level, env) in levels("make") {
        let o = h.run_role("tool", env, &script);
        let r = results(&o);
        let ctx = format!("{level}: {}\n{}", stdout(&o), stderr(&o));
        assert_eq!(r.get("recipe").map(String::as_str), Some("ran"), "{ctx}");
        assert_eq!(r.get("make").map(String::as_str), Some("0"), "{ctx}");
        if python {
            assert_eq!(r.get("same").map(String::as_str), Some("ok"), "{ctx}");
            for k in ["uid", "gid", "reuid", "groups"] {
                assert_eq!(r.get(k).map(String::as_str), Some("refused"), "{k}: {ctx}");
            }
            let ids = r.get("ids").cloned().unwrap_or_default();
            assert!(!ids.contains("(0,"), "{ids}: {ctx}");
        }
    }
}

/// A confinement step that fails stops the child before its program runs,
/// and the error names the step: here the capability check of a stage
/// started with capabilities (root, nothing dropped) — the program, which
/// would create a file, never runs.
#[test]
fn a_failed_confinement_step_stops_the_child_before_exec() {
    if !nix::unistd::geteuid().is_root() {
        common::skip_or_fail("needs root: the stage must start with capabilities to fail");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("program-ran");
    let policy = serde_json::json!({
        "landlock": false,
        "scopes": false,
        "read_exec": [],
        "read_only": [],
        "writable": [],
        "seccomp": true,
        "seccomp_role": "tool",
        "no_network": true,
        "require_no_caps": true,
    });
    {
        let o = Command::new(env!("CARGO_BIN_EXE_mini-letta-stage2"))
            .args([
                "tool",
                "--agent",
                "x",
                "--policy",
                &policy.to_string(),
                "--",
            ])
            .args(["touch", marker.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("capabilities were not dropped"),
            "{}",
            stderr(&o)
        );
        assert!(!marker.exists(), "the program ran after a failed step");
    }
}

/// Issue 44: as an ordinary user on a host where a root supervisor had
/// made its cgroup directories, `sandbox status` said "cgroup yes" (it saw
/// the directories, not whether this user may make groups in them) and
/// the turn then failed on them. A layer is reported only when this
/// process can use it, and a launch at the level `status` printed works:
/// the user's turns remember, as root's do.
#[test]
fn an_ordinary_user_is_told_the_truth_and_its_turns_remember() {
    // Root's own probe makes (or finds) the root-owned groups.
    let root_view = status_json(&[]);
    let Some(user) = common::user::User::create("an ordinary user's turns") else {
        return;
    };
    let o = user.run(&["sandbox", "status", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    if root_view["cgroup"]["available"] == true {
        assert_eq!(v["cgroup"]["available"], false, "{v}");
        assert!(
            v["missing"].to_string().contains("cgroup"),
            "says the layer is missing: {v}"
        );
    }
    // What it printed is what a launch gets.
    let o = user.run(&["agent", "create", "al"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = user.run(&["sandbox", "run", "-a", "al", "--", "true"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let o = user.run(&["chat", "-a", "al", "-p", "remember: I like green tea"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let human = common::user::head_file(&user.git_dir(), "human.md");
    assert!(
        human.contains("I like green tea"),
        "not committed at HEAD: {human}"
    );
    let o = user.run(&["chat", "-a", "al", "-p", "hello again"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("hello again"), "{}", stdout(&o));
}

/// The verdict of attack `id` in a `sandbox verify --json` report.
fn verdict_of<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["report"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {report}"))
}

/// `sandbox verify --json` output, checked to have passed with nothing
/// escaped.
fn passed_verify(o: &Output, what: &str) -> Value {
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{what}: {e}: {}{}", stdout(o), stderr(o)));
    assert!(o.status.success(), "{what}: {v}\n{}", stderr(o));
    assert_eq!(v["report"]["escaped"], 0, "{what}: {v}");
    v
}

/// Issue 44: as an ordinary user, `sandbox verify` found two escapes — a
/// hard link planted in the attacker's memory (agents shared the user's
/// uid, so file permissions no longer separated them) and a fork bomb (no
/// pids limit without a cgroup). Both are stopped now, on a host where a
/// root supervisor made its cgroup directories and on one with no cgroups
/// at all, with per-agent uids from the user's subordinate range (the
/// link's target is another uid's 0600 file; the process limit binds the
/// agent's uid) and without them (the supervisor refuses to start a child
/// beside the link; the limit is counted in the child's own user
/// namespace).
#[test]
fn an_ordinary_user_passes_the_escape_catalogue() {
    // Root's probe makes (or finds) its root-owned groups first.
    let _ = status_json(&[]);
    let Some(user) = common::user::User::create("the escape catalogue as a user") else {
        return;
    };
    let mut modes: Vec<(&str, &[(&str, &str)])> =
        vec![("shared uid", &[("MINI_LETTA_SANDBOX_DISABLE", "subids")])];
    match user.has_subids() {
        Ok(()) => modes.push(("subordinate uids", &[])),
        Err(why) => common::skip_or_fail(&format!(
            "the user has no per-agent uids ({why}): the catalogue ran without them only"
        )),
    }
    for (mode, env) in modes {
        let with_groups = user.run_env(&["sandbox", "verify", "--json"], env);
        let without = user.run_without_cgroups(&["sandbox", "verify", "--json"], env);
        for (where_, o) in [
            ("root's cgroup directories present", &with_groups),
            ("no cgroups visible", &without),
        ] {
            let what = format!("{mode}, {where_}");
            let v = passed_verify(o, &what);
            let link = verdict_of(&v, "08-planted-hardlink");
            assert_eq!(link["verdict"], "blocked", "{what}: {link}");
            let evidence = link["evidence"].as_str().unwrap();
            if mode == "shared uid" {
                assert!(
                    evidence.contains("hard links"),
                    "the refusal says why: {link}"
                );
            } else {
                assert!(evidence.contains("EACCES"), "another uid's file: {link}");
            }
            let bomb = verdict_of(&v, "37-fork-bomb");
            assert_eq!(bomb["verdict"], "blocked", "{what}: {bomb}");
            assert!(
                bomb["evidence"].as_str().unwrap().contains("EAGAIN"),
                "stopped by the limit: {bomb}"
            );
        }
    }
    // The status the user sees on that host says there is no cgroup.
    let o = user.run_without_cgroups(&["sandbox", "status", "--json"], &[]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cgroup"]["available"], false, "{v}");
}

/// Issue 44: where `/etc/subuid` and `/etc/subgid` grant the user a range
/// (`usermod --add-subuids/--add-subgids`, as rootless container engines
/// use), each agent's children run as a host uid of its own from it, seen
/// from the host: two agents' commands, two different uids, both in the
/// range and neither the user's; `sandbox status` says where they come from.
#[test]
fn a_user_with_subordinate_ids_runs_each_agent_as_its_own_host_uid() {
    let Some(user) = common::user::User::create("per-agent uids for a user") else {
        return;
    };
    let (start, count) = user.ensure_subids();
    if let Err(why) = user.has_subids() {
        common::skip_or_fail(&format!("no per-agent uids for a user with a range: {why}"));
        return;
    }
    let o = user.run(&["sandbox", "status"]);
    assert!(
        stdout(&o).contains(&format!("subordinate range {start}..{}", start + count)),
        "{}",
        stdout(&o)
    );
    // Two agents of one home, and one of another home of the same user:
    // uids are handed out once per user, never again in the next home.
    let other_home = user.home().with_file_name("h2");
    let other = [("MINI_LETTA_HOME", other_home.to_str().unwrap())];
    let mut sleepers = Vec::new();
    for (name, secs, env) in [
        ("ua", "41.0071", &[][..]),
        ("ub", "41.0072", &[][..]),
        ("uc", "41.0073", &other[..]),
    ] {
        let o = user.run_env(&["agent", "create", name], env);
        assert!(o.status.success(), "{}", stderr(&o));
        sleepers.push((
            secs,
            user.spawn_env(&["sandbox", "run", "-a", name, "--", "sleep", secs], env),
        ));
    }
    let mut uids = Vec::new();
    for (secs, _) in &sleepers {
        let pid = common::user::wait_for(std::time::Duration::from_secs(20), || {
            common::user::pid_running(&["sleep", secs])
        })
        .unwrap_or_else(|| panic!("no `sleep {secs}` came up"));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid: u32 = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        uids.push(uid);
    }
    for (secs, mut child) in sleepers {
        if let Some(pid) = common::user::pid_running(&["sleep", secs]) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.wait();
    }
    let distinct: std::collections::BTreeSet<_> = uids.iter().collect();
    assert_eq!(distinct.len(), 3, "agents sharing a uid: {uids:?}");
    for u in &uids {
        assert!(
            (start..start + count).contains(u) && *u != user.uid(),
            "host uid {u} is not from the user's range {start}+{count}"
        );
    }
}

/// Where a user's kernel refuses it user namespaces, children share the
/// user's uid and see the home's paths: the supervisor's control socket is
/// reachable from inside, and a peer's uid no longer tells the operator
/// from a child. A control connection must then present the key only the
/// user can read; the probe connects, cannot read the key, and is refused
/// at hello. What this level cannot give by design (a pid namespace, a
/// bounding set an unprivileged process could empty, an orphan's tie to
/// the launcher without a cgroup) is skipped naming the missing layer,
/// never reported as blocked or escaped.
#[test]
fn a_user_without_namespaces_keeps_children_off_the_control_socket() {
    let Some(user) = common::user::User::create("the control key") else {
        return;
    };
    // Without per-agent uids too: with them, the socket's mode keeps
    // children out already.
    let no_ns = [("MINI_LETTA_SANDBOX_DISABLE", "namespaces,subids")];
    let o = user.run_env(&["sandbox", "verify", "--json"], &no_ns);
    let v = passed_verify(&o, "no namespaces");
    let socket = verdict_of(&v, "22-control-socket");
    assert_eq!(socket["verdict"], "blocked", "{socket}");
    let evidence = socket["evidence"].as_str().unwrap();
    assert!(
        evidence.contains("refused at hello") && evidence.contains("could not read"),
        "{socket}"
    );
    for id in ["15-visible-pids", "33-capabilities"] {
        let r = verdict_of(&v, id);
        assert_eq!(r["verdict"], "skipped", "{r}");
        assert!(
            r["reason"].to_string().contains("by design")
                || r["evidence"].to_string().contains("by design"),
            "{r}"
        );
    }
    // The user's own CLI presents the key: its turns run at this level.
    let o = user.run_env(&["agent", "create", "nk"], &no_ns);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = user.run_env(
        &["chat", "-a", "nk", "-p", "remember: I like oolong"],
        &no_ns,
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let o = user.run_env(&["sandbox", "run", "-a", "nk", "--", "true"], &no_ns);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

/// A user's processes without per-agent uids (its agents share its uid).
const SHARED: &[(&str, &str)] = &[("MINI_LETTA_SANDBOX_DISABLE", "subids")];

/// Agents sharing the user's uid are kept apart by what their trees may
/// hold: a memory file that is also another file (a second hard link) or
/// that another uid owns stops the agent's children from starting, with
/// the file named and nothing moved or deleted; once it is gone, turns run.
#[test]
fn a_users_agent_with_a_linked_or_foreign_memory_file_is_not_started() {
    let Some(user) = common::user::User::create("linked memory files") else {
        return;
    };
    for name in ["la", "lb"] {
        let o = user.run_env(&["agent", "create", name], SHARED);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let secret = user.agent_dir("lb").join("memory/secret.md");
    std::fs::write(&secret, "B-ONLY\n").unwrap();
    let uid = user.uid();
    std::os::unix::fs::chown(&secret, Some(uid), Some(uid)).unwrap();
    let planted = user.agent_dir("la").join("memory/notes.md");
    std::fs::hard_link(&secret, &planted).unwrap();
    let o = user.run_env(&["chat", "-a", "la", "-p", "what do you know?"], SHARED);
    assert!(!o.status.success(), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&planted.display().to_string()) && err.contains("2 hard links"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), "B-ONLY\n");
    std::fs::remove_file(&planted).unwrap();

    let foreign = user.agent_dir("la").join("memory/foreign.md");
    std::fs::write(&foreign, "planted\n").unwrap();
    std::os::unix::fs::chown(&foreign, Some(54_321), Some(54_321)).unwrap();
    let o = user.run_env(&["chat", "-a", "la", "-p", "what do you know?"], SHARED);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("belongs to uid 54321"),
        "{}",
        stderr(&o)
    );
    assert!(foreign.exists(), "nothing is removed");
    std::fs::remove_file(&foreign).unwrap();

    let o = user.run_env(&["chat", "-a", "la", "-p", "hello"], SHARED);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}
