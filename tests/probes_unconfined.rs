//! The unconfined control column of the escape catalogue (spec
//! `sandbox.md` §d, §e.4 P0): every probe runs in this test process, with no
//! sandbox at all, against a decoy layout — so the attacks an unconfined
//! process can obviously make must come out `escaped`. That proves each
//! probe is not vacuous. Also checks the catalogue's shape and `run_one`'s
//! JSON, and that the probes leave nothing behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use mini_letta::sandbox::probes::{self, ProbeContext, Verdict};

const MARKER: &str = "SECRET-MARKER-7f3a9c";
const ENV_NAME: &str = "MINI_LETTA_PROBE_TEST_KEY";
const ENV_VALUE: &str = "sk-probe-test-value-0123456789";

/// The decoy world; dropping it kills the decoy processes and removes
/// everything created outside the temp dir.
struct Decoy {
    _tmp: tempfile::TempDir,
    ctx: ProbeContext,
    procs: Vec<Child>,
    shm: Option<PathBuf>,
    _tcp: TcpListener,
    _control: UnixListener,
    _abstract: UnixListener,
}

impl Drop for Decoy {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(p) = &self.shm {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn sleeper(env: bool) -> Child {
    let mut cmd = Command::new("sleep");
    cmd.arg("60")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if env {
        cmd.env(ENV_NAME, ENV_VALUE);
    }
    // Its own session, like a supervisor-launched child.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn().expect("spawn sleep")
}

fn decoy() -> Decoy {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let tag = format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().canonicalize().unwrap();
    let agents = home.join("agents");
    let a = agents.join("agent-a");
    let b = agents.join("agent-b");
    let git = a.join("memory.git");
    std::fs::create_dir_all(git.join("hooks")).unwrap();
    std::fs::write(git.join("config"), "[core]\n\tbare = false\n").unwrap();
    std::fs::create_dir_all(a.join("memory")).unwrap();
    std::fs::write(a.join("memory/human.md"), "- likes tea\n").unwrap();
    std::fs::create_dir_all(a.join("tmp")).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let secret = b.join("secret.md");
    std::fs::write(&secret, format!("---\nname: B\n---\n{MARKER}\n")).unwrap();
    std::fs::create_dir_all(home.join("run")).unwrap();

    let symlink = a.join("planted-symlink");
    std::os::unix::fs::symlink(&secret, &symlink).unwrap();
    let hardlink = a.join("planted-hardlink");
    std::fs::hard_link(&secret, &hardlink).unwrap();

    // A setuid copy of `id` owned by `nobody`: running it as anyone else
    // must show euid 65534 when nothing stops setuid.
    let setuid = if nix::unistd::geteuid().is_root() && Path::new("/usr/bin/id").exists() {
        let p = a.join("id-setuid");
        std::fs::copy("/usr/bin/id", &p).unwrap();
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4755)).unwrap();
        Some(p)
    } else {
        None
    };

    let shm = Path::new("/dev/shm")
        .is_dir()
        .then(|| PathBuf::from(format!("/dev/shm/mini-letta-probe-test-{tag}")))
        .filter(|p| std::fs::write(p, b"host shm").is_ok());

    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let control_socket = home.join("run/supervisor.sock");
    let control = UnixListener::bind(&control_socket).unwrap();
    // Greets whoever connects, as a supervisor that lets every peer in
    // would (the probe counts an escape only once it is greeted).
    let greeter = control.try_clone().unwrap();
    std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        for mut s in greeter.incoming().flatten() {
            let mut line = String::new();
            let _ = BufReader::new(s.try_clone().unwrap()).read_line(&mut line);
            let _ =
                s.write_all(b"{\"type\":\"hello\",\"version\":1,\"server\":\"any\",\"pid\":1}\n");
        }
    });
    let abstract_name = format!("mini-letta-probe-test-{tag}");
    let abstract_listener =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap())
            .unwrap();

    let supervisor = sleeper(true);
    let sibling = sleeper(false);
    let ctx = ProbeContext {
        own_agent_dir: a.clone(),
        own_memory_git_dir: git,
        other_agent_dir: b,
        other_secret_file: secret,
        secret_marker: MARKER.into(),
        agents_dir: agents,
        supervisor_pid: supervisor.id(),
        sibling_pid: sibling.id(),
        env_secret_name: ENV_NAME.into(),
        env_secret_value: ENV_VALUE.into(),
        control_socket,
        host_tcp_port: tcp.local_addr().unwrap().port(),
        host_abstract_socket: abstract_name,
        planted_symlink: Some(symlink),
        planted_hardlink: Some(hardlink),
        planted_setuid: setuid,
        host_shm_name: shm
            .as_ref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned()),
        pids_limit: Some(64),
        fsize_limit: Some(1 << 20),
        scratch_dir: a.join("tmp"),
        read_only_checkout: Some(a.join("memory")),
        egress: None,
        by_design: None,
    };
    Decoy {
        _tmp: tmp,
        ctx,
        procs: vec![supervisor, sibling],
        shm,
        _tcp: tcp,
        _control: control,
        _abstract: abstract_listener,
    }
}

fn probe_leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|e| {
            e.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".mini-letta-probe-"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn catalogue_shape() {
    let cat = probes::catalogue();
    let ids: BTreeSet<&str> = cat.iter().map(|a| a.id).collect();
    assert_eq!(ids.len(), cat.len(), "ids must be unique");
    let numbers: BTreeSet<u32> = cat.iter().map(|a| a.number).collect();
    assert!(
        numbers.len() >= 44,
        "only {} §d rows covered",
        numbers.len()
    );
    // §d rows 1–49, the seccomp regression rows 50–63, the supervisor's
    // trust-boundary rows 64–65, the sub-agent row 66, the planted
    // object-store row 67, the egress rows 68–71, the stream protocols 72.
    assert!(numbers.iter().all(|n| (1..=72).contains(n)));
    for n in 50..=72 {
        assert!(numbers.contains(&n), "regression row {n} missing");
    }
    for a in cat {
        assert!(
            a.id.starts_with(&format!("{:02}-", a.number)),
            "{} does not start with its row number",
            a.id
        );
        assert!(!a.title.is_empty());
        assert_eq!(probes::find(a.id).map(|f| f.id), Some(a.id));
    }
    assert_eq!(probes::find("12").map(|a| a.number), Some(12));
    assert!(probes::find("no-such-probe").is_none());
}

#[test]
fn run_one_json_and_serde() {
    let d = decoy();
    let text = serde_json::to_string(&d.ctx).unwrap();
    let ctx: ProbeContext = serde_json::from_str(&text).unwrap();
    let v = probes::run_one("33-capabilities", &ctx);
    assert_eq!(v["id"], "33-capabilities");
    assert_eq!(v["number"], 33);
    assert!(v["title"].is_string());
    assert!(v["elapsed_ms"].is_u64());
    let verdict = v["verdict"].as_str().unwrap();
    assert!(["blocked", "escaped", "skipped"].contains(&verdict), "{v}");
    let detail = if verdict == "skipped" {
        "reason"
    } else {
        "evidence"
    };
    assert!(v[detail].is_string(), "{v}");
    // One JSON line.
    assert!(!v.to_string().contains('\n'));
    // The verdict part round-trips through the enum.
    let back: Verdict = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(back.name(), verdict);

    let unknown = probes::run_one("99-nope", &ctx);
    assert_eq!(unknown["verdict"], "skipped");
    assert!(unknown["reason"].as_str().unwrap().contains("unknown"));
}

#[test]
fn unconfined_control_column() {
    let mut d = decoy();
    let ctx = d.ctx.clone();
    let etc_before = probe_leftovers(Path::new("/etc"));
    let started = std::time::Instant::now();

    let mut results: BTreeMap<&str, Verdict> = BTreeMap::new();
    for a in probes::catalogue() {
        let v = probes::run(a, &ctx);
        eprintln!("{:<28} {:<8} {}", a.id, v.name(), v.detail());
        results.insert(a.id, v);
    }
    eprintln!("catalogue ran in {:?}", started.elapsed());

    for (id, v) in &results {
        assert!(
            !v.detail().starts_with("probe failed"),
            "{id} panicked: {}",
            v.detail()
        );
    }

    // What any unconfined process can do must be seen as an escape.
    let mut must_escape = vec![
        "01-read-other-agent",
        "02-enumerate-agents",
        "03-write-outside",
        "04-symlink-to-other",
        "05-planted-symlink",
        "06-hardlink-other-in",
        "08-planted-hardlink",
        "09-rename-across",
        "10-proc-self-root",
        "11-supervisor-root-cwd",
        "15-visible-pids",
        "16-signal-supervisor",
        "17-signal-sibling",
        "22-control-socket",
        "24-abstract-socket",
        "25-tcp-localhost",
        "37-fork-bomb",
        "39-disk-fill",
        "40-orphan-survival",
        "42-git-hook",
        "43-git-config",
        "48-sandbox-off-switches",
        "66-sub-agent-writes-checkout",
        "67-git-object-store-plant",
        // Without a sandbox the host's listener is reached directly.
        "68-egress-no-route",
        // Seccomp regression rows any process reaches without a filter.
        "52-namespace-calls",
        "53-ptrace-kcmp-init",
        "55-file-handles",
        "59-socket-families",
        "63-unknown-syscall",
    ];
    // Any process makes an MPTCP socket where the kernel has MPTCP on.
    if std::fs::read_to_string("/proc/sys/net/mptcp/enabled").is_ok_and(|v| v.trim() == "1") {
        must_escape.push("72-stream-protocols");
    }
    if d.shm.is_some() {
        must_escape.push("45-ipc-namespace");
        must_escape.push("60-dev-shm-write");
    }
    if nix::unistd::geteuid().is_root() {
        // Root reads any same-host process's environ.
        must_escape.push("12-supervisor-environ");
        must_escape.push("33-capabilities");
        // Privileged calls that pass the kernel's own capability checks.
        must_escape.extend([
            "51-mount-api",
            "54-kernel-objects",
            "56-kernel-log-and-boot",
            "57-clock-and-hostname",
            "58-mknodat-devices",
            "61-proc-kmsg",
        ]);
    }
    let mut missed = Vec::new();
    for id in &must_escape {
        let v = &results[id];
        if !v.is_escaped() {
            missed.push(format!("{id}: {} {}", v.name(), v.detail()));
        }
    }
    assert!(
        missed.is_empty(),
        "probes blind to an unconfined escape:\n{}",
        missed.join("\n")
    );

    assert!(
        results["01-read-other-agent"]
            .detail()
            .contains("marker is in them")
    );
    if nix::unistd::geteuid().is_root() {
        assert!(results["12-supervisor-environ"].detail().contains("IN IT"));
    }
    // No channel here: the channel-only probes say so.
    for id in ["23-channel-privileged-rpc", "49-secret-commit"] {
        assert!(results[id].is_skipped(), "{id}: {:?}", results[id]);
    }
    // The setuid copy (owned by nobody) ran with its owner's euid.
    if ctx.planted_setuid.is_some() {
        assert!(
            results["32-setuid-binary"].is_escaped(),
            "{:?}",
            results["32-setuid-binary"]
        );
    }

    // Side effects: everything undone, decoys alive.
    let secret = std::fs::read_to_string(&ctx.other_secret_file).unwrap();
    assert!(secret.contains(MARKER), "B's secret was not restored");
    for c in &mut d.procs {
        assert!(c.try_wait().unwrap().is_none(), "a decoy process died");
    }
    let scratch: Vec<_> = std::fs::read_dir(&ctx.scratch_dir).unwrap().collect();
    assert!(scratch.is_empty(), "scratch dir not cleaned: {scratch:?}");
    let agents: BTreeSet<String> = std::fs::read_dir(&ctx.agents_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(agents, BTreeSet::from(["agent-a".into(), "agent-b".into()]));
    assert_eq!(
        std::fs::read_dir(&ctx.other_agent_dir).unwrap().count(),
        1,
        "files left in B"
    );
    let hooks: Vec<_> = std::fs::read_dir(ctx.own_memory_git_dir.join("hooks"))
        .unwrap()
        .collect();
    assert!(hooks.is_empty(), "hooks left behind: {hooks:?}");
    assert!(probe_leftovers(&ctx.own_memory_git_dir).is_empty());
    assert_eq!(probe_leftovers(Path::new("/etc")), etc_before);
    assert!(probe_leftovers(Path::new("/usr")).is_empty());
    assert!(probe_leftovers(Path::new("/root")).is_empty());
    assert!(started.elapsed().as_secs() < 20, "catalogue too slow");
}
