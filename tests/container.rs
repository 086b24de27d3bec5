#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Many hosts, one memory, in containers: `scripts/container-lab` with
//! Debian's podman (run where podman answers, skipped loudly otherwise, and
//! a failure under `MINI_LETTA_REQUIRE_CONTAINER=1`, as CI sets), the shape
//! of `container/compose.yaml`, and what `sandbox status` reports where user
//! namespaces are refused, as in a default container.

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use mini_letta::sandbox::report::{Isolation, Level};
use serde_json::Value;

/// Set to `1` where a container engine must be there: a skip then fails.
const REQUIRE_CONTAINER_ENV: &str = "MINI_LETTA_REQUIRE_CONTAINER";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn compose_file() -> PathBuf {
    repo().join("container/compose.yaml")
}

/// Say loudly that the container scenario did not run; under
/// `MINI_LETTA_REQUIRE_CONTAINER=1` fail instead.
fn skip_container(reason: &str) {
    eprintln!(
        "SKIPPED container scenario: {reason}; the two-homes tests in tests/hosts.rs stand in"
    );
    if std::env::var(REQUIRE_CONTAINER_ENV).as_deref() == Ok("1") {
        panic!("{REQUIRE_CONTAINER_ENV}=1 but the container scenario was skipped: {reason}");
    }
}

/// What a command printed, and whether it succeeded before `limit`.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Run `program args` with stdin closed, killing it after `limit`. A
/// program that cannot be started is a failure whose stderr says why.
fn run_for(program: &str, args: &[&str], limit: Duration) -> Ran {
    let mut child = match Command::new(program)
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return Ran {
                ok: false,
                stdout: String::new(),
                stderr: format!("{program}: {e}"),
            };
        }
    };
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let (ok, timed_out) = loop {
        match child.try_wait() {
            Ok(Some(status)) => break (status.success(), false),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break (false, true);
            }
        }
    };
    let mut stderr = err.join().unwrap_or_default();
    if timed_out {
        stderr.push_str(&format!("\n(killed after {} s)", limit.as_secs()));
    }
    Ran {
        ok,
        stdout: out.join().unwrap_or_default(),
        stderr,
    }
}

/// Why the container lab cannot run here, if it cannot: it needs root
/// (rootful podman), podman answering, and mmdebstrap for the base image.
fn lab_unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (rootful podman)".into());
    }
    let info = run_for("podman", &["info"], Duration::from_secs(30));
    if !info.ok {
        let first = info.stderr.lines().find(|l| !l.trim().is_empty());
        return Some(format!(
            "`podman info` failed ({}); apt-get install -y podman runc mmdebstrap",
            first.unwrap_or("no output").trim()
        ));
    }
    let mm = run_for("mmdebstrap", &["--version"], Duration::from_secs(30));
    if !mm.ok {
        return Some("mmdebstrap not found (it makes the base image without a registry)".into());
    }
    None
}

/// Issue 46: the image, agents inside it, and lab 6, for real.
/// `scripts/container-lab` makes a base image from Debian's packages, the
/// project's image from the programs this test run built, then, in a
/// default container and three common variants, runs `sandbox status` and
/// a remembering chat — failing unless every child of the chat was launched
/// at the level the status printed — runs `sandbox verify` in a default
/// container, and runs lab 6 with three etcd members and two hosts sharing
/// a remote.
#[test]
fn the_container_lab_runs_in_a_default_container_and_across_hosts() {
    if let Some(why) = lab_unavailable() {
        return skip_container(&why);
    }
    let bins = bin().parent().unwrap().to_path_buf();
    let lab = run_for(
        repo().join("scripts/container-lab").to_str().unwrap(),
        &["--binaries", bins.to_str().unwrap()],
        Duration::from_secs(20 * 60),
    );
    let said = format!("{}{}", lab.stdout, lab.stderr);
    assert!(lab.ok, "container-lab failed:\n{said}");
    eprintln!("{said}");
    // A default container: the level sandbox status printed, and the chat's
    // children launched at it (the lab checks the spawn records).
    let default = said
        .lines()
        .find(|l| l.trim_start().starts_with("default "))
        .unwrap_or_else(|| panic!("no row for the default container:\n{said}"));
    let level = default.split_whitespace().nth(1).unwrap_or("");
    assert!(
        default.contains(&format!("children at {level}")),
        "{default}"
    );
    assert!(said.contains(" 0 escaped"), "{said}");
    assert!(
        said.contains("second answered 我记得：我住在杭州。"),
        "{said}"
    );
    assert!(said.contains("ownership: seed took epoch"), "{said}");
}

/// The lines of service `name` in a compose file (two-space indented
/// services, as `container/compose.yaml` writes them).
fn service_block<'a>(text: &'a str, name: &str) -> &'a str {
    let header = format!("\n  {name}:\n");
    let start = text
        .find(&header)
        .unwrap_or_else(|| panic!("no service {name}"))
        + header.len();
    let rest = &text[start..];
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        let top_level = !line.starts_with(' ') && !line.trim().is_empty();
        let sibling =
            line.starts_with("  ") && !line.starts_with("   ") && !line[2..].starts_with('#');
        if top_level || sibling {
            return &rest[..offset];
        }
        offset += line.len();
    }
    rest
}

#[test]
fn compose_file_has_two_hosts_sharing_one_remote() {
    let text = std::fs::read_to_string(compose_file()).unwrap();
    // The services, each with a home of its own and the shared remote.
    let service = |name: &str| service_block(&text, name).to_string();
    let seed = service("seed");
    let second = service("second");
    assert!(seed.contains("- data1:/data"), "{seed}");
    assert!(second.contains("- data2:/data"), "{second}");
    for s in [&seed, &second] {
        assert!(s.contains("- remote:/remote"), "{s}");
    }
    assert!(
        text.contains("MINI_LETTA_REMOTE_ROOT: /remote"),
        "the remote root must be the shared volume"
    );
    assert!(
        seed.contains("mini-letta agent create agent-demo"),
        "{seed}"
    );
    assert!(seed.contains(r#"-p "记住: 我住在杭州""#), "{seed}");
    assert!(seed.contains("mini-letta sync -a agent-demo"), "{seed}");
    assert!(
        second.contains(r#"command: ["chat", "-a", "agent-demo", "-p", "你知道我什么？"]"#),
        "{second}"
    );
    assert!(
        second.contains("condition: service_completed_successfully"),
        "{second}"
    );
    // With ownership: three etcd members, both hosts in the cluster under
    // host ids of their own.
    for m in ["etcd0", "etcd1", "etcd2"] {
        let member = service(m);
        assert!(member.contains(&format!("NAME: {m}")), "{member}");
    }
    let cluster = "MINI_LETTA_ETCD: http://etcd0:2379,http://etcd1:2379,http://etcd2:2379";
    for (s, id) in [(&seed, "seed"), (&second, "second")] {
        assert!(s.contains(cluster), "{s}");
        assert!(s.contains(&format!("MINI_LETTA_HOST_ID: {id}")), "{s}");
    }
    // Named volumes, and default container security.
    let volumes = &text[text.find("\nvolumes:\n").expect("top-level volumes")..];
    for v in ["data1:", "data2:", "remote:"] {
        assert!(volumes.contains(&format!("\n  {v}")), "volume {v}");
    }
    for loosening in ["privileged", "seccomp", "cap_add", "security_opt"] {
        assert!(
            !text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .any(|l| l.contains(loosening)),
            "compose.yaml loosens the container ({loosening})"
        );
    }
}

fn level_of(v: &Value) -> Level {
    match v["level"].as_str() {
        Some("L0") => Level::L0,
        Some("L2") => Level::L2,
        Some("L3") => Level::L3,
        Some("L4") => Level::L4,
        Some("None") => Level::None,
        other => panic!("unknown level {other:?} in {v}"),
    }
}

#[test]
fn sandbox_status_is_honest_where_user_namespaces_are_refused() {
    // The real denial a default container gives: run `sandbox status` in a
    // user namespace that may not create further ones.
    let bwrap = "/usr/bin/bwrap";
    let probe = Command::new(bwrap)
        .args([
            "--unshare-user",
            "--disable-userns",
            "--dev-bind",
            "/",
            "/",
            "--",
            "/bin/true",
        ])
        .stdin(Stdio::null())
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            skip(&format!(
                "container-like status: `bwrap --unshare-user --disable-userns` fails here: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            return;
        }
        Err(e) => {
            skip(&format!("container-like status: {bwrap}: {e}"));
            return;
        }
    }
    let bin = bin();
    let o = Command::new(bwrap)
        .args([
            "--unshare-user",
            "--disable-userns",
            "--uid",
            "0",
            "--gid",
            "0",
            "--dev-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--",
        ])
        .arg(&bin)
        .args(["sandbox", "status", "--json"])
        .env_remove("MINI_LETTA_SANDBOX_DISABLE")
        .env_remove("MINI_LETTA_NAMESPACES")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();

    assert_eq!(v["namespaces"]["available"], false, "{v}");
    assert!(v["ns_backend"].is_null(), "{v}");
    // Root of a user namespace that maps only itself cannot become an
    // agent uid, and says so instead of claiming the layer.
    assert_eq!(v["uid_switch"]["available"], false, "{v}");
    assert!(
        v["uid_switch"]["detail"]
            .as_str()
            .unwrap_or("")
            .contains("cannot switch to agent uid"),
        "{v}"
    );
    assert!(
        v["missing"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str().unwrap_or("").starts_with("namespaces:")),
        "the missing layer is not named: {v}"
    );
    assert!(
        !v["backend"].as_str().unwrap().contains("bwrap")
            && !v["backend"].as_str().unwrap().contains("namespaces"),
        "{v}"
    );
    // Without namespaces the level follows landlock and seccomp alone.
    let landlock = v["landlock"]["available"] == true;
    let abi = v["landlock_abi"].as_i64().unwrap();
    let seccomp = v["seccomp"]["available"] == true;
    let level = level_of(&v);
    let expected = match (landlock, seccomp) {
        (true, true) if abi >= 6 => Level::L2,
        (true, true) => Level::L3,
        (false, false) => Level::None,
        _ => Level::L4,
    };
    assert_eq!(level, expected, "{v}");
    if landlock && seccomp && abi >= 6 {
        // The case of a default container on a current kernel.
        assert_eq!(level, Level::L2, "{v}");
    }
    // Strict accepts L0 and L2 only; degraded anything but no layer at all.
    assert_eq!(
        Isolation::Strict.accepts(level),
        matches!(level, Level::L0 | Level::L2),
        "{v}"
    );
    assert_eq!(Isolation::Degraded.accepts(level), level != Level::None);

    // The human-readable report says the same, including the verdict.
    let o = Command::new(bwrap)
        .args([
            "--unshare-user",
            "--disable-userns",
            "--uid",
            "0",
            "--gid",
            "0",
            "--dev-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--",
        ])
        .arg(&bin)
        .args(["sandbox", "status"])
        .env_remove("MINI_LETTA_SANDBOX_DISABLE")
        .env_remove("MINI_LETTA_NAMESPACES")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = stdout(&o);
    assert!(
        text.starts_with(&format!("level: {}", v["level"].as_str().unwrap())),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("namespaces") && l.to_lowercase().contains(" no ")),
        "{text}"
    );
    let verdict = if Isolation::Strict.accepts(level) {
        "strict mode accepts this host"
    } else {
        "strict mode REFUSES children on this host"
    };
    assert!(text.lines().any(|l| l.trim() == verdict), "{text}");
}

/// Issue 46: in a default container `/proc` has masked paths, so the
/// kernel refuses a child in a new pid namespace a fresh procfs. The
/// native namespace probe never mounted proc: `sandbox status` said L0 and
/// every chat then failed `mount proc on /tmp/newroot/proc: Operation not
/// permitted`. Here the same mask without a container: the supervisor runs
/// in a mount namespace where a file of `/proc` is covered, as podman and
/// docker cover theirs. The probe now does what a launch does, so status
/// reports the level a launch really gets, and the chat runs at it.
#[test]
fn a_masked_proc_makes_status_report_the_level_a_chat_gets() {
    if !confinement_or_skip("masked /proc") {
        return;
    }
    let home = open_home();
    let h = home.path();
    create_agent(h, &["owl"]);
    // A file of /proc covered by /dev/null, as a container engine masks
    // /proc/timer_list, /proc/keys and others (whichever this kernel has).
    let masked = |args: &str| {
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(format!(
                r#"for f in /proc/timer_list /proc/keys /proc/sysrq-trigger; do
                     [ -e "$f" ] && mount --bind /dev/null "$f" && exec "$0" {args}
                   done; echo 'no /proc file to mask' >&2; exit 1"#
            ))
            .arg(bin())
            .env("MINI_LETTA_HOME", h)
            .env_remove("MINI_LETTA_SANDBOX_DISABLE")
            .env_remove("MINI_LETTA_NAMESPACES")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let o = masked("sandbox status --json");
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let level = v["level"].as_str().unwrap_or("").to_string();
    let detail = v["namespaces"]["detail"].as_str().unwrap_or("");
    assert_eq!(v["namespaces"]["available"], false, "{v}");
    assert!(detail.contains("mounting proc"), "{detail}");
    // The chat runs, every child at the level status printed.
    let o = masked("chat -a owl -p hello");
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let o = run(h, &["audit", "log", "--kind", "spawn", "--json"]);
    let levels: Vec<String> = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|r| r["level"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(!levels.is_empty(), "no spawn records");
    assert!(
        levels.iter().all(|l| *l == level),
        "status said {level}, children launched at {levels:?}"
    );
}
