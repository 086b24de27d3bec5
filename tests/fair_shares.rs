//! Fair shares under a hostile tenant (issue 45): one tenant floods the
//! egress proxy — names that never resolve, connections refused as fast
//! as it can open them — while another's requests keep their latency.
//!
//! These compare latencies (the other tenant's p99 during the flood
//! against its own baseline), so they run in a test binary of their own,
//! one at a time: cargo runs test binaries one after another, and the
//! rest of the suite running beside them would be measured as the flood.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/mod.rs"]
mod common;
#[path = "hostile/egress_world.rs"]
mod egress_world;

use std::process::Command;
use std::sync::Mutex;

use common::{Daemon, bin, confinement_or_skip, stderr, stdout};
use egress_world::*;

/// One test at a time in this binary.
static ALONE: Mutex<()> = Mutex::new(());

/// `python3 -c script` confined as `agent`, in the background.
fn flood_as(h: &std::path::Path, agent: &str, script: &str) -> std::process::Child {
    Command::new(bin())
        .args(["sandbox", "run", "-a", agent, "--", "python3", "-c", script])
        .env("MINI_LETTA_HOME", h)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// wren's p99 for `url` during a flood, up to three tries until one is
/// within twice `base`: a spike of the machine is not the flood (which
/// cost seconds per request, or a refusal).
fn p99_during(h: &std::path::Path, url: &str, base: f64) -> Vec<f64> {
    let mut tries = Vec::new();
    for _ in 0..3 {
        let now = p99(&request_latencies(h, "wren", url, 300));
        tries.push(now);
        if now <= 2.0 * base {
            break;
        }
    }
    tries
}

/// Issue 45 (3): every agent's name resolution shared 8 blocking permits
/// (policy reads too), a resolver thread held its permit for as long as
/// the system resolver took, and the wait for one had no bound: during one
/// tenant's flood of names that never resolve, another tenant's requests
/// failed `502 the resolver is busy` or took 5-11 s instead of 1 ms. Each
/// agent now resolves within a share of its own, with a bounded wait for
/// every permit: the other tenant's p99 stays within twice its baseline.
/// The names are answered by a name server the test controls: one that
/// never answers, named by the supervisor's `/etc/resolv.conf`.
#[test]
fn one_tenants_slow_names_do_not_slow_another_tenant() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    if !confinement_or_skip("slow names") {
        return;
    }
    let (_silent, ns) = silent_name_server();
    let service = Server::start("P1");
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    ok(h, &["agent", "create", "owl"]);
    ok(h, &["agent", "create", "wren"]);
    let hosts = h.join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    let resolv = h.join("resolv.conf");
    std::fs::write(
        &resolv,
        format!("nameserver {ns}\noptions timeout:5 attempts:2\n"),
    )
    .unwrap();
    let _stop = start_resolving_with(h, &hosts, Some(&resolv));
    allow(h, "owl", &["*.slow.test:80"]);
    allow(h, "wren", &[&format!("localhost:{}", service.port)]);
    let url = format!("http://localhost:{}/tea", service.port);
    let baseline = request_latencies(h, "wren", &url, 300);
    // The flood: 32 connections at a time, each asking for a name the
    // silent server never answers, for 12 s.
    let flood = r#"
import socket, threading, time, itertools
end = time.monotonic() + 12
counter = itertools.count()
def worker():
    while time.monotonic() < end:
        name = "n%d.slow.test" % next(counter)
        try:
            s = socket.create_connection(("127.0.0.1", @PROXY_PORT@))
            s.sendall(("GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n" % (name, name)).encode())
            s.recv(4096)
            s.close()
        except OSError:
            time.sleep(0.05)
threads = [threading.Thread(target=worker) for _ in range(32)]
for t in threads: t.start()
for t in threads: t.join()
print("flooded")
"#
    .replace("@PROXY_PORT@", PROXY.rsplit(':').next().unwrap());
    let flooder = flood_as(h, "owl", &flood);
    // Long enough for the flood to hold every resolver it can.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let base = p99(&baseline);
    let tries = p99_during(h, &url, base);
    let flooded = flooder.wait_with_output().unwrap();
    assert!(
        stdout(&flooded).contains("flooded"),
        "the flood did not run: {}{}",
        stdout(&flooded),
        stderr(&flooded)
    );
    eprintln!("wren p99: {base:.1} ms alone, {tries:.1?} ms during owl's flood");
    assert!(
        tries.iter().any(|now| *now <= 2.0 * base),
        "wren's p99 went from {base:.1} ms to {tries:.1?} ms during owl's flood"
    );
    // The flood's own refusals name the cause.
    let refused = network_log(h, "owl", 1);
    assert!(
        refused.iter().any(|r| r["host"]
            .as_str()
            .is_some_and(|n| n.ends_with(".slow.test"))),
        "{refused:?}"
    );
}

/// Issue 45 (1): each connection costs the supervisor work before any
/// verdict, and nothing limited how many a child opened: one command's
/// loop of refused requests spent most of a core of the supervisor's CPU,
/// which every tenant shares. New connections are now paced per agent
/// (a burst, then a rate): an 8 s flood from 16 threads gets no more than
/// that through, and another tenant's requests keep their latency.
#[test]
fn a_flood_of_connections_is_paced_per_agent() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    if !confinement_or_skip("connection pacing") {
        return;
    }
    use mini_letta::egress::pace::{BURST, RATE_PER_SEC};
    let d = Daemon::start(&["owl", "wren"]);
    let h = d.path();
    let service = Server::start("P1");
    allow(h, "wren", &[&format!("localhost:{}", service.port)]);
    let url = format!("http://localhost:{}/tea", service.port);
    let baseline = p99(&request_latencies(h, "wren", &url, 300));
    let flood = r#"
import socket, threading, time
secs = 8.0
start = time.monotonic()
end = start + secs
done = [0] * 16
def worker(i):
    while time.monotonic() < end:
        s = socket.create_connection(("127.0.0.1", @PROXY_PORT@))
        s.sendall(b"GET http://not-listed.example/ HTTP/1.1\r\nHost: not-listed.example\r\n\r\n")
        s.recv(4096)
        s.close()
        done[i] += 1
threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print(sum(done), time.monotonic() - start)
"#
    .replace("@PROXY_PORT@", PROXY.rsplit(':').next().unwrap());
    let flooder = flood_as(h, "owl", &flood);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let tries = p99_during(h, &url, baseline);
    let flooded = flooder.wait_with_output().unwrap();
    let out = stdout(&flooded);
    let mut words = out.split_whitespace();
    let (Some(Ok(answered)), Some(Ok(secs))) = (
        words.next().map(str::parse::<f64>),
        words.next().map(str::parse::<f64>),
    ) else {
        panic!("the flood did not run: {out}{}", stderr(&flooded));
    };
    eprintln!(
        "owl's flood: {answered} connections in {secs:.1} s; wren p99 {baseline:.1} ms alone, \
         {tries:.1?} ms during it"
    );
    let most = BURST + RATE_PER_SEC * secs;
    assert!(
        answered <= most,
        "{answered} connections answered in {secs:.1} s (at most {most})"
    );
    assert!(
        tries.iter().any(|now| *now <= 2.0 * baseline),
        "wren's p99 went from {baseline:.1} ms to {tries:.1?} ms during owl's flood"
    );
}
