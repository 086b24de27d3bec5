//! Network egress (issue 34): a confined command reaches the network only
//! through the supervisor's proxy, only to what its agent's allow-list
//! names, and every attempt is recorded.
//!
//! Two HTTP servers on the host's loopback stand for the outside world;
//! the commands run confined (`sandbox run`, a Bash call in a turn) and
//! fetch with `curl` through the proxy variables the sandbox sets, or talk
//! raw HTTP to the proxy endpoint with `python3` (both are on the host's
//! `/usr`, which every role may execute).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::common::{Daemon, bin, confinement_or_skip, run, stderr, stdout, wait_until};
use crate::egress_world::*;

/// The acceptance lines of `sandbox run`: an allowed host through the
/// proxy (plain and tunnelled), the other server and the allowed port by
/// IP refused without reaching either server, no way around the proxy,
/// another agent refused, every attempt in the log with its verdict.
#[test]
fn a_command_reaches_only_its_agents_listed_hosts_through_the_proxy() {
    if !confinement_or_skip("egress through the proxy") {
        return;
    }
    let d = Daemon::start(&["owl", "cat"]);
    let h = d.path();
    let (p1, p2) = (Server::start("P1"), Server::start("P2"));
    allow(h, "owl", &[&format!("localhost:{}", p1.port)]);

    // Plain HTTP through the proxy variables.
    let (code, out, err) = fetch(h, "owl", &[&format!("http://localhost:{}/a", p1.port)]);
    assert_eq!(
        (code, out.as_str()),
        (0, "hello from P1 /a\n"),
        "stderr: {err}"
    );
    assert_eq!(
        p1.host_of("/a").as_deref(),
        Some(&*format!("localhost:{}", p1.port))
    );
    // Through a CONNECT tunnel (what HTTPS uses; the proxy sees no
    // plaintext past the CONNECT line).
    let (code, out, err) = fetch(
        h,
        "owl",
        &["--proxytunnel", &format!("http://localhost:{}/b", p1.port)],
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "hello from P1 /b\n"),
        "stderr: {err}"
    );

    // The other server, and the allowed port written as an IP: refused
    // with a 403 and a reason, and neither server sees the request.
    let url = format!("http://localhost:{}/refused-name", p2.port);
    let (code, why) = status_of(h, "owl", &[], &url);
    assert_eq!(code, "403", "localhost:P2 must be refused: {why}");
    assert!(why.contains("allow-list"), "the reason: {why}");
    let url = format!("http://127.0.0.1:{}/refused-ip", p1.port);
    let (code, why) = status_of(h, "owl", &[], &url);
    assert_eq!(code, "403", "127.0.0.1:P1 must be refused: {why}");
    let url = format!("http://localhost:{}/refused-tunnel", p2.port);
    let (_, why) = status_of(h, "owl", &["--proxytunnel"], &url);
    assert!(
        why.contains("response 403"),
        "CONNECT localhost:P2 must be refused: {why}"
    );
    assert!(
        !p2.saw("/refused-name") && !p2.saw("/refused-tunnel"),
        "P2 saw {:?}",
        p2.lines()
    );
    assert!(!p1.saw("/refused-ip"), "P1 saw {:?}", p1.lines());

    // Around the proxy: no route, whatever address is tried.
    for target in [
        format!("http://localhost:{}/direct", p1.port),
        format!("http://127.0.0.1:{}/direct", p1.port),
    ] {
        let (code, _, err) = fetch(h, "owl", &["--noproxy", "*", &target]);
        assert_ne!(code, 0, "a direct connection must fail: {err}");
    }
    assert!(!p1.saw("/direct"), "P1 saw {:?}", p1.lines());

    // Another tenant has no list: refused the very host owl may reach.
    let url = format!("http://localhost:{}/other-agent", p1.port);
    let (code, why) = status_of(h, "cat", &[], &url);
    assert_eq!(code, "403", "an agent with no list is refused: {why}");
    assert!(why.contains("no network allow-list"), "{why}");
    assert!(!p1.saw("/other-agent"));

    // The record: each attempt, its verdict, attributed.
    let records = network_log(h, "owl", 5);
    let get = find(&records, "localhost", p1.port, "GET").expect("the allowed GET");
    assert_eq!(get["verdict"], "allowed", "{get}");
    assert_eq!(get["role"], "tool", "{get}");
    assert!(get["bytes_down"].as_u64().unwrap() > 0, "{get}");
    let tunnel = find(&records, "localhost", p1.port, "CONNECT").expect("the tunnel");
    assert_eq!(tunnel["verdict"], "allowed", "{tunnel}");
    for (host, port) in [("localhost", p2.port), ("127.0.0.1", p1.port)] {
        let r = records
            .iter()
            .find(|r| r["host"] == host && r["port"] == json!(port))
            .unwrap_or_else(|| panic!("no record of {host}:{port} in {records:?}"));
        assert_eq!(r["verdict"], "denied", "{r}");
        assert!(r["reason"].as_str().is_some_and(|s| !s.is_empty()), "{r}");
    }
    for r in &records {
        assert_eq!(r["agent"], d.agents[0].as_str(), "{r}");
        assert!(
            r["child"].as_u64().is_some() && r["time"].is_string(),
            "{r}"
        );
    }
    let cat = network_log(h, "cat", 1);
    assert_eq!(cat.len(), 1, "{cat:?}");
    assert_eq!(cat[0]["verdict"], "denied");
    assert_eq!(cat[0]["agent"], d.agents[1].as_str());
    // `--since` in the future: nothing.
    let o = run(
        h,
        &[
            "agent",
            "network-log",
            "owl",
            "--json",
            "--since",
            "2999-01-01",
        ],
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["records"], json!([]), "{v}");
    // Refusals reach the supervisor's log, attributed.
    let log = std::fs::read_to_string(h.join("run/supervisor.log")).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("egress") && l.contains(&d.agents[1])),
        "no attributed refusal in the supervisor log"
    );
    // Each refusal is a `denied` record of the audit log, attributed from
    // the child table; the allow-list set above is a `config` record; the
    // chain verifies; `usage` counts the bytes that went through.
    let o = run(h, &["audit", "log", "--kind", "denied", "--json"]);
    assert!(o.status.success(), "audit log: {}", stderr(&o));
    // One record per line, as the log holds them.
    let denied: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (agent, host, port) in [
        (&d.agents[0], "localhost", p2.port),
        (&d.agents[0], "127.0.0.1", p1.port),
        (&d.agents[1], "localhost", p1.port),
    ] {
        assert!(
            denied.iter().any(|r| r["agent"] == agent.as_str()
                && r["host"] == host
                && r["port"] == json!(port)
                && r["method"] == "egress"),
            "no denied record of {agent} {host}:{port} in {denied:?}"
        );
    }
    let o = run(
        h,
        &["audit", "log", "--kind", "config", "--json", "-a", "owl"],
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("\"network\"") && text.contains(&format!("localhost:{}", p1.port)),
        "the allow-list change is audited: {text}"
    );
    let o = run(h, &["audit", "verify"]);
    assert!(o.status.success(), "audit verify: {}", stdout(&o));
    let o = run(h, &["usage", "-a", "owl", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["agents"][0]["egress_bytes"].as_u64().unwrap_or(0) > 0,
        "usage counts egress bytes: {v}"
    );
}

/// A Bash call in a turn runs in the agent's own child; its commands get
/// the same proxy, the same list and the same answers as `sandbox run`.
#[test]
fn a_bash_call_in_a_turn_gets_what_sandbox_run_gets() {
    if !confinement_or_skip("egress from the Bash tool") {
        return;
    }
    let p1 = Server::start("P1");
    let p2 = Server::start("P2");
    let command = format!(
        "curl -sS http://localhost:{}/turn; curl -sS -o /dev/null -w ' %{{http_code}}' http://localhost:{}/turn",
        p1.port, p2.port
    );
    let script_dir = crate::common::open_home();
    let script = script_dir.path().join("script.json");
    let turns = json!({"turns": [
        {"tool_calls": [{"name": "Bash", "arguments": {"command": command, "description": "fetch"}}]},
        {"text": "fetched"}
    ]});
    std::fs::write(&script, turns.to_string()).unwrap();
    let d = Daemon::start_with_env(
        &["owl"],
        &[("MINI_LETTA_SCRIPTED_MODEL", script.to_str().unwrap())],
    );
    let h = d.path();
    ok(h, &["agent", "set-model", "owl", "mock/scripted"]);
    allow(h, "owl", &[&format!("localhost:{}", p1.port)]);

    let o = Command::new(bin())
        .args(["chat", "-a", "owl", "--json", "-p", "fetch it"])
        .env("MINI_LETTA_HOME", h)
        .env("MINI_LETTA_SCRIPTED_MODEL", &script)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("chat: {e}: {}{}", stdout(&o), stderr(&o)));
    let in_turn = v["events"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["type"] == "tool_result")
        .and_then(|e| e["text"].as_str())
        .unwrap_or_else(|| panic!("no tool result: {v}"))
        .to_string();
    let (_, by_run, err) = confined(h, "owl", &["sh", "-c", &command]);
    assert_eq!(in_turn, by_run, "sandbox run's stderr: {err}");
    assert_eq!(by_run, "hello from P1 /turn\n 403", "{err}");
    assert!(!p2.saw("/turn"));
    let records = network_log(h, "owl", 4);
    let roles: Vec<&str> = records.iter().filter_map(|r| r["role"].as_str()).collect();
    assert!(
        roles.contains(&"agent") && roles.contains(&"tool"),
        "{records:?}"
    );
    drop(script_dir);
}

/// Hostile clients of the proxy, from inside the sandbox: a malformed
/// request line, a 1 MiB header, a CONNECT to a refused port, a URL with
/// credentials aimed elsewhere, a Host header naming another server, and
/// a client that sends nothing. Each gets a clear refusal or is closed,
/// and the proxy serves the good requests between them.
#[test]
fn hostile_clients_are_refused_and_the_proxy_keeps_serving() {
    if !confinement_or_skip("hostile proxy clients") {
        return;
    }
    let d = Daemon::start(&["owl"]);
    let h = d.path();
    std::fs::write(
        h.join("config.toml"),
        "[network]\nrequest_timeout_secs = 3\n",
    )
    .unwrap();
    let (p1, p2) = (Server::start("P1"), Server::start("P2"));
    allow(h, "owl", &[&format!("localhost:{}", p1.port)]);
    let client = HOSTILE_CLIENT
        .replace("@P1@", &p1.port.to_string())
        .replace("@P2@", &p2.port.to_string())
        .replace("@PROXY_PORT@", PROXY.rsplit(':').next().unwrap());
    let (code, out, err) = confined(h, "owl", &["python3", "-c", &client]);
    assert_eq!(code, 0, "client failed: {out}{err}");
    let lines: std::collections::BTreeMap<&str, &str> =
        out.lines().filter_map(|l| l.split_once(' ')).collect();
    for good in ["g1", "g2", "g3", "g4", "g5"] {
        assert_eq!(lines.get(good), Some(&"HTTP/1.1 200 OK"), "{good}: {out}");
    }
    assert_eq!(
        lines.get("malformed").map(|s| &s[..12]),
        Some("HTTP/1.1 400"),
        "{out}"
    );
    assert_eq!(
        lines.get("big").map(|s| &s[..12]),
        Some("HTTP/1.1 431"),
        "{out}"
    );
    assert_eq!(
        lines.get("connect").map(|s| &s[..12]),
        Some("HTTP/1.1 403"),
        "{out}"
    );
    assert_eq!(
        lines.get("userinfo").map(|s| &s[..12]),
        Some("HTTP/1.1 400"),
        "{out}"
    );
    // The silent client was closed by the proxy (not by its own timeout of
    // 60 s), within the request timeout and some slack.
    let silent: u64 = lines.get("silent").unwrap().parse().unwrap();
    assert!(silent <= 20, "{out}");
    // What a Host header names does not choose the server.
    assert_eq!(
        p1.host_of("/g5").as_deref(),
        Some(&*format!("localhost:{}", p1.port))
    );
    assert!(p2.lines().is_empty(), "P2 saw {:?}", p2.lines());
    assert!(
        !p1.saw("/big") && !p1.saw("/userinfo"),
        "P1 saw {:?}",
        p1.lines()
    );

    let records = network_log(h, "owl", 10);
    let denied: Vec<&str> = records
        .iter()
        .filter(|r| r["verdict"] == "denied")
        .filter_map(|r| r["reason"].as_str())
        .collect();
    assert!(denied.len() >= 5, "{records:?}");
    assert!(denied.iter().any(|r| r.contains("malformed")), "{denied:?}");
}

/// The limits hold from inside: past `max_connections` a connection is
/// answered 503 at once, a transfer past `max_bytes` is cut, an idle
/// tunnel is closed — and the supervisor's thread count does not follow
/// the number of connections.
#[test]
fn a_tenant_cannot_exceed_its_connection_byte_and_idle_limits() {
    if !confinement_or_skip("egress limits") {
        return;
    }
    let d = Daemon::start(&["owl"]);
    let h = d.path();
    std::fs::write(
        h.join("config.toml"),
        "[network]\nmax_connections = 3\nmax_bytes = 200000\nidle_timeout_secs = 2\n",
    )
    .unwrap();
    let p1 = Server::start("P1");
    allow(h, "owl", &[&format!("localhost:{}", p1.port)]);
    let client = LIMITS_CLIENT
        .replace("@P1@", &p1.port.to_string())
        .replace("@PROXY_PORT@", PROXY.rsplit(':').next().unwrap());
    let (code, out, err) = confined(h, "owl", &["python3", "-c", &client]);
    assert_eq!(code, 0, "client failed: {out}{err}");
    let lines: std::collections::BTreeMap<&str, &str> =
        out.lines().filter_map(|l| l.split_once(' ')).collect();
    // Three tunnels open and idle: the fourth connection is refused.
    assert_eq!(lines.get("tunnels"), Some(&"3"), "{out}");
    assert_eq!(
        lines.get("fourth").map(|s| &s[..12]),
        Some("HTTP/1.1 503"),
        "{out}"
    );
    // The idle tunnels were closed by the proxy within its timeout.
    let idle: u64 = lines.get("idle_closed_after").unwrap().parse().unwrap();
    assert!(idle <= 10, "{out}");
    // Once they are gone, a connection is served again; a 1 MiB answer
    // is cut at the byte limit.
    assert_eq!(lines.get("after"), Some(&"HTTP/1.1 200 OK"), "{out}");
    let big: usize = lines.get("big_bytes").unwrap().parse().unwrap();
    assert!(big < 300_000, "{out}");
    let records = network_log(h, "owl", 6);
    let reasons: Vec<&str> = records
        .iter()
        .filter_map(|r| r["reason"].as_str())
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("too many connections")),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.contains("idle")), "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("byte limit")),
        "{reasons:?}"
    );
}

/// Many connections at once from one command cost the supervisor tasks,
/// not threads: its thread count stays within a fixed margin (the
/// blocking share for names and files, the launch's own) while 40
/// transfers of 1 MiB run.
#[test]
fn many_connections_cost_tasks_not_threads() {
    if !confinement_or_skip("egress threads") {
        return;
    }
    let d = Daemon::start(&["owl"]);
    let h = d.path();
    let p1 = Server::start("P1");
    allow(h, "owl", &[&format!("localhost:{}", p1.port)]);
    let pid = d.pid();
    let threads = move || -> usize {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    // A first command warms the launch path's threads up.
    let (code, _, err) = fetch(h, "owl", &[&format!("http://localhost:{}/warm", p1.port)]);
    assert_eq!(code, 0, "{err}");
    let before = threads();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, most) = (
        done.clone(),
        Arc::new(std::sync::atomic::AtomicUsize::new(0)),
    );
    let peak = most.clone();
    let sampler = std::thread::spawn(move || {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            peak.fetch_max(threads(), std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    });
    let client = format!(
        "import socket, threading\n\
         ok = []\n\
         def one(i):\n\
         \x20   s = socket.create_connection(('127.0.0.1', 3128), timeout=60)\n\
         \x20   s.sendall(b'GET http://localhost:{p}/big HTTP/1.1\\r\\n\\r\\n')\n\
         \x20   n = 0\n\
         \x20   while True:\n\
         \x20       c = s.recv(65536)\n\
         \x20       if not c: break\n\
         \x20       n += len(c)\n\
         \x20   ok.append(n > 1 << 20)\n\
         ts = [threading.Thread(target=one, args=(i,)) for i in range(40)]\n\
         [t.start() for t in ts]\n\
         [t.join() for t in ts]\n\
         print(sum(ok))\n",
        p = p1.port
    );
    let (code, out, err) = confined(h, "owl", &["python3", "-c", &client]);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    assert_eq!((code, out.trim()), (0, "40"), "{err}");
    let peak = most.load(std::sync::atomic::Ordering::Relaxed);
    // The proxy's threads for one agent (policy reads and its share of
    // name resolution), and 8 for the launch's own blocking steps (plan,
    // cgroups): a thread per connection would be 40.
    let margin = mini_letta::egress::serve::READERS + mini_letta::egress::resolver::PER_AGENT + 8;
    assert!(
        peak <= before + margin,
        "40 connections took the supervisor from {before} to {peak} threads: {}",
        names(pid)
    );
}

fn names(pid: u32) -> String {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|c| c.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.join(",")
}

/// The limits client (python3, run confined).
const LIMITS_CLIENT: &str = r#"
import socket, time
P1, PORT = @P1@, @PROXY_PORT@
def conn():
    return socket.create_connection(("127.0.0.1", PORT), timeout=30)
def answer(s):
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        data += chunk
    return data
tunnels = []
for i in range(3):
    s = conn()
    s.sendall(b"CONNECT localhost:%d HTTP/1.1\r\n\r\n" % P1)
    line = s.recv(100)
    if line.startswith(b"HTTP/1.1 200"):
        tunnels.append(s)
print("tunnels", len(tunnels), flush=True)
s = conn()
s.sendall(b"GET http://localhost:%d/x HTTP/1.1\r\n\r\n" % P1)
print("fourth", answer(s).split(b"\r\n")[0].decode(), flush=True)
started = time.time()
for t in tunnels:
    answer(t)
print("idle_closed_after", round(time.time() - started), flush=True)
time.sleep(0.5)
s = conn()
s.sendall(b"GET http://localhost:%d/after HTTP/1.1\r\n\r\n" % P1)
print("after", answer(s).split(b"\r\n")[0].decode(), flush=True)
s = conn()
s.sendall(b"GET http://localhost:%d/big HTTP/1.1\r\n\r\n" % P1)
print("big_bytes", len(answer(s)), flush=True)
"#;

/// The hostile client (python3, run confined): one line per exchange,
/// `<tag> <status line>`.
const HOSTILE_CLIENT: &str = r#"
import socket, threading, time
P1, P2, PORT = @P1@, @P2@, @PROXY_PORT@
def conn():
    return socket.create_connection(("127.0.0.1", PORT), timeout=60)
def answer(s):
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        data += chunk
    return data
def status(data):
    return data.split(b"\r\n", 1)[0].decode(errors="replace")
def exchange(tag, payload):
    s = conn()
    s.sendall(payload)
    print(tag, status(answer(s)), flush=True)
def good(tag, extra=b""):
    exchange(tag, b"GET http://localhost:%d/%s HTTP/1.1\r\nHost: localhost:%d\r\n%s\r\n" % (P1, tag.encode(), P1, extra))
started = time.time()
silent = conn()
good("g1")
exchange("malformed", b"NONSENSE\r\n\r\n")
good("g2")
big = conn()
def send_big():
    try:
        big.sendall(b"GET http://localhost:%d/big HTTP/1.1\r\nX-Big: " % P1 + b"a" * (1 << 20) + b"\r\n\r\n")
    except OSError:
        pass
t = threading.Thread(target=send_big)
t.start()
print("big", status(answer(big)), flush=True)
t.join()
good("g3")
exchange("connect", b"CONNECT localhost:%d HTTP/1.1\r\nHost: localhost:%d\r\n\r\n" % (P2, P2))
good("g4")
exchange("userinfo", b"GET http://localhost:%d@127.0.0.1:%d/userinfo HTTP/1.1\r\n\r\n" % (P1, P2))
s = conn()
s.sendall(b"GET http://localhost:%d/g5 HTTP/1.1\r\nHost: localhost:%d\r\n\r\n" % (P1, P2))
print("g5", status(answer(s)), flush=True)
silent.settimeout(60)
answer(silent)
print("silent", round(time.time() - started), flush=True)
"#;

/// The list is the supervisor's: set and shown by the operator, given to
/// new agents by `config.toml`, checked entry by entry, and out of every
/// child's reach.
#[test]
fn the_allow_list_is_the_operators_and_out_of_the_agents_reach() {
    let home = crate::common::open_home();
    let h = home.path();
    std::fs::write(
        h.join("config.toml"),
        "[network]\nallow = [\"pypi.org\", \"*.github.com:443\"]\n",
    )
    .unwrap();
    let id = crate::common::create_agent(h, &["owl"]);
    let show = |h: &Path| -> Value {
        serde_json::from_str(&ok(h, &["agent", "show", "owl", "--json"])).unwrap()
    };
    assert_eq!(
        show(h)["network"],
        json!({"allow": ["pypi.org", "*.github.com:443"]})
    );
    ok(
        h,
        &[
            "agent",
            "set-network",
            "owl",
            "--allow",
            "LocalHost:8080",
            "--allow",
            "[::1]:9",
        ],
    );
    assert_eq!(
        show(h)["network"],
        json!({"allow": ["localhost:8080", "[::1]:9"]})
    );
    for bad in [
        "*",
        "http://pypi.org",
        "pypi.org:0",
        "pypi.org:99999",
        "bad host",
        "a..b",
        "127.1",
        "pypi.org/simple",
        "*.",
        "user@pypi.org",
        "\u{202e}gro.ipyp",
    ] {
        let o = run(h, &["agent", "set-network", "owl", "--allow", bad]);
        assert!(!o.status.success(), "{bad:?} was accepted");
    }
    assert_eq!(show(h)["network"]["allow"].as_array().unwrap().len(), 2);
    ok(h, &["agent", "set-network", "owl", "--none"]);
    assert_eq!(show(h)["network"], json!({"allow": []}));
    let o = run(h, &["agent", "set-network", "owl"]);
    assert!(!o.status.success(), "neither --allow nor --none");

    // A typo in [network] is an error, not a silently empty list.
    std::fs::write(h.join("config.toml"), "[network]\nalow = [\"pypi.org\"]\n").unwrap();
    let o = run(h, &["agent", "create", "cat"]);
    assert!(
        !o.status.success() && stderr(&o).contains("alow"),
        "{}",
        stderr(&o)
    );

    // Stored outside the agents' tree, the operator's alone.
    let dir = h.join("network").join(&id);
    let mode = |p: &Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
    };
    assert_eq!(mode(&dir) & 0o077, 0, "{}", dir.display());
    if !confinement_or_skip("the allow-list is out of the sandbox's reach") {
        return;
    }
    let target = dir.join("allow.json");
    let attack = format!(
        "cat {t}; echo '{{\"allow\":[\"evil.example\"]}}' > {t}; ls {d}",
        t = target.display(),
        d = dir.display()
    );
    let (code, _, _) = confined(h, "owl", &["sh", "-c", &attack]);
    assert_ne!(code, 0);
    let stored = std::fs::read_to_string(&target).unwrap();
    assert!(!stored.contains("evil"), "{stored}");
    // Deleting the agent takes its list and log with it.
    ok(h, &["agent", "delete", "owl", "--yes"]);
    assert!(!dir.exists(), "{} survived the agent", dir.display());
}

/// `sandbox verify` proves the path on this host: no route out without
/// the proxy, a listed host reached only through it, a refused host
/// refused, and DNS answering nothing inside the namespace.
#[test]
fn sandbox_verify_has_the_egress_rows() {
    if !confinement_or_skip("sandbox verify egress rows") {
        return;
    }
    let home = crate::common::open_home();
    let o = run(
        home.path(),
        &["sandbox", "verify", "--role", "tool", "--json"],
    );
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("verify: {e}: {}{}", stdout(&o), stderr(&o)));
    let rows = v["report"]["results"].as_array().unwrap();
    for id in [
        "68-egress-no-route",
        "69-egress-listed-host",
        "70-egress-refused-host",
        "71-egress-dns",
    ] {
        let row = rows
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("no row {id}"));
        assert_eq!(row["verdict"], "blocked", "{row}");
    }
    assert_eq!(v["ok"], json!(true), "{}", v["report"]["failures"]);
}

/// Issue 45 (6): a command with the egress proxy may open TCP sockets, and
/// its seccomp filter checked only their family and type: an MPTCP socket
/// (`IPPROTO_MPTCP`, a stream protocol landlock's TCP rules do not cover)
/// could be made, bound and listened on. The protocol argument is checked
/// now: the default or TCP; MPTCP and SCTP streams are refused, and plain
/// TCP still works.
#[test]
fn stream_sockets_other_than_tcp_are_refused() {
    if !confinement_or_skip("stream protocols") {
        return;
    }
    let d = Daemon::start(&["owl"]);
    let h = d.path();
    let p1 = Server::start("P1");
    allow(h, "owl", &[&format!("localhost:{}", p1.port)]);
    let client = r#"
import socket
for name, fam, proto in [("tcp", socket.AF_INET, 0), ("tcp6", socket.AF_INET6, socket.IPPROTO_TCP),
                         ("mptcp", socket.AF_INET, 262), ("mptcp6", socket.AF_INET6, 262),
                         ("sctp", socket.AF_INET, 132)]:
    try:
        s = socket.socket(fam, socket.SOCK_STREAM, proto)
        print(name, "made")
        s.close()
    except OSError as e:
        print(name, "refused", e.errno)
"#;
    let (code, out, err) = confined(h, "owl", &["python3", "-c", client]);
    assert_eq!(code, 0, "client failed: {out}{err}");
    let got: std::collections::BTreeMap<&str, &str> =
        out.lines().filter_map(|l| l.split_once(' ')).collect();
    assert_eq!(got.get("tcp"), Some(&"made"), "{out}");
    assert_eq!(got.get("tcp6"), Some(&"made"), "{out}");
    for p in ["mptcp", "mptcp6", "sctp"] {
        assert_eq!(
            got.get(p),
            Some(&format!("refused {}", libc::EPERM).as_str()),
            "{p}: {out}"
        );
    }
}

/// Issue 45 (2): only loopback, `0.0.0.0/8` and `deny_cidrs` were refused,
/// so a name on a tenant's list whose DNS answer was one of the host's own
/// interface addresses reached a service listening there. The proxy now
/// refuses, for any name, the host's interface addresses and every
/// private or local range, unless an entry names the address literally.
/// The names are answered by a resolver the test controls: the supervisor
/// runs in a mount namespace whose `/etc/hosts` says what they are.
#[test]
fn a_name_leading_to_the_hosts_own_or_a_private_address_is_refused() {
    if !confinement_or_skip("host addresses") {
        return;
    }
    let Some(host_ip) = mini_letta::egress::cidr::host_addresses()
        .into_iter()
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
    else {
        crate::common::skip_or_fail("this host has no non-loopback IPv4 address to aim at");
        return;
    };
    let service = Server::start_on("host-service", host_ip);
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    ok(h, &["agent", "create", "owl"]);
    let hosts = h.join("hosts");
    std::fs::write(
        &hosts,
        format!("127.0.0.1 localhost\n{host_ip} hostaddr.test\n10.11.12.13 private.test\n"),
    )
    .unwrap();
    let _stop = start_resolving_with(h, &hosts, None);
    let port = service.port;
    allow(
        h,
        "owl",
        &[
            &format!("hostaddr.test:{port}"),
            &format!("private.test:{port}"),
        ],
    );
    let (code, body) = status_of(h, "owl", &[], &format!("http://hostaddr.test:{port}/"));
    assert_eq!(code, "403", "{body}");
    assert!(
        body.contains("this host's interfaces") || body.contains("private or local range"),
        "{body}"
    );
    let (code, body) = status_of(h, "owl", &[], &format!("http://private.test:{port}/"));
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("private or local range"), "{body}");
    assert!(
        service.lines().is_empty(),
        "the service was reached: {:?}",
        service.lines()
    );
    // Named literally, the address is the operator's choice: the same
    // name now reaches the service (it was the check that refused).
    allow(
        h,
        "owl",
        &[
            &format!("hostaddr.test:{port}"),
            &format!("{host_ip}:{port}"),
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (code, body) = status_of(h, "owl", &[], &format!("http://hostaddr.test:{port}/"));
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("hello from host-service"), "{body}");
}

/// The refusals `denials` records account for: one each, plus those it
/// carries (`suppressed_before`); a record of counted refusals only
/// (`suppressed`) is not one itself.
fn refusals_in(denials: &[&Value]) -> u64 {
    denials
        .iter()
        .map(|r| match r["suppressed"].as_u64() {
            Some(n) => n,
            None => 1 + r["suppressed_before"].as_u64().unwrap_or(0),
        })
        .sum()
}

/// A tmpfs of `mb` MiB mounted at a fresh directory, unmounted when dropped.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount(mb: u32) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let o = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mb}m,mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output()
            .unwrap();
        o.status.success().then_some(SmallDisk(dir))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// A home on a tmpfs of `mb` MiB with `agents`, its supervisor started:
/// `None` (said loudly, a failure where confinement is required) when no
/// tmpfs can be mounted.
fn on_small_disk(mb: u32, agents: &[&str]) -> Option<(SmallDisk, Supervised)> {
    let Some(disk) = SmallDisk::mount(mb) else {
        crate::common::skip_or_fail("cannot mount a small tmpfs home (needs root)");
        return None;
    };
    let h = disk.0.path().join("home");
    for a in agents {
        ok(&h, &["agent", "create", a]);
    }
    ok(&h, &["supervisor", "start"]);
    Some((disk, Supervised(h)))
}

/// Issue 45 (1): every refused egress attempt was a durable `denied`
/// record, with no limit per agent: one command wrote 85k records in 25 s,
/// filled a 48 MiB home, and then every tenant's spawn, turn and model call
/// failed on the full disk. Past a per-agent rate, refusals are now counted
/// and carried by the next record (`suppressed_before`), so a flood of
/// 3000 refused requests on a 48 MiB home leaves a few dozen records that
/// still account for every attempt; the other tenant's turn works, and the
/// log verifies.
#[test]
fn a_flood_of_refused_requests_costs_its_own_agent_only() {
    if !confinement_or_skip("egress flood") {
        return;
    }
    let Some((_disk, supervised)) = on_small_disk(48, &["owl", "wren"]) else {
        return;
    };
    let h = supervised.0.clone();
    let p1 = Server::start("P1");
    allow(&h, "owl", &[&format!("localhost:{}", p1.port)]);
    // 3000 refused requests (a host not on the list), then, once the
    // agent's rate allows a record again, one more.
    let client = r#"
import socket, time
def refused():
    s = socket.create_connection(("127.0.0.1", @PROXY_PORT@))
    s.sendall(b"GET http://not-listed.example/ HTTP/1.1\r\nHost: not-listed.example\r\n\r\n")
    s.recv(4096)
    s.close()
for _ in range(2000):
    refused()
time.sleep(0.5)
refused()
print("done")
"#
    .replace("@PROXY_PORT@", PROXY.rsplit(':').next().unwrap());
    let (code, out, err) = confined(&h, "owl", &["python3", "-c", &client]);
    assert_eq!(code, 0, "client failed: {out}{err}");
    let recs = audit_records(&h);
    let owl_denials: Vec<&Value> = recs
        .iter()
        .filter(|r| r["kind"] == "denied" && r["method"] == "egress")
        .collect();
    let accounted = refusals_in(&owl_denials);
    assert!(
        owl_denials.len() < 200,
        "{} records for 2001 refusals",
        owl_denials.len()
    );
    assert_eq!(accounted, 2001, "every refusal accounted for once");
    let size = std::fs::metadata(h.join("audit/audit.jsonl"))
        .unwrap()
        .len();
    assert!(size < 1 << 20, "the audit log grew to {size} bytes");
    // The other tenant is untouched.
    let o = run(&h, &["chat", "-a", "wren", "-p", "remember: I like tea"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let o = run(&h, &["audit", "verify"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

/// Issue 45 (1): refusals past the rate were counted and carried by a
/// record up to 10 s later — and lost when the supervisor stopped first.
/// Stopping now writes what is counted: every refusal of a flood stopped
/// at once is accounted for.
#[test]
fn refusals_counted_but_not_recorded_are_written_when_the_supervisor_stops() {
    if !confinement_or_skip("egress flood at stop") {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    ok(h, &["agent", "create", "owl"]);
    ok(h, &["supervisor", "start"]);
    let supervised = Supervised(h.to_path_buf());
    let client = r#"
import socket
for _ in range(300):
    s = socket.create_connection(("127.0.0.1", @PROXY_PORT@))
    s.sendall(b"GET http://not-listed.example/ HTTP/1.1\r\nHost: not-listed.example\r\n\r\n")
    s.recv(4096)
    s.close()
print("done")
"#
    .replace("@PROXY_PORT@", PROXY.rsplit(':').next().unwrap());
    let (code, out, err) = confined(h, "owl", &["python3", "-c", &client]);
    assert_eq!(code, 0, "client failed: {out}{err}");
    ok(h, &["supervisor", "stop", "--timeout", "10"]);
    drop(supervised);
    let recs = audit_records(h);
    let denials: Vec<&Value> = recs
        .iter()
        .filter(|r| r["kind"] == "denied" && r["method"] == "egress")
        .collect();
    let accounted = refusals_in(&denials);
    assert_eq!(accounted, 300, "every refusal accounted for once");
    let o = run(h, &["audit", "verify"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

/// Issue 45 (1): the audit log refuses a child's action while its disk is
/// down to the reserve, before the disk fills: on a 20 MiB home filled to
/// within 1 MiB, a command is refused saying so, the log still verifies
/// (nothing torn), and once space is freed commands run again.
#[test]
fn the_audit_log_refuses_a_childs_action_before_its_disk_is_full() {
    if !confinement_or_skip("audit disk reserve") {
        return;
    }
    let Some((disk, supervised)) = on_small_disk(20, &["owl"]) else {
        return;
    };
    let h = supervised.0.clone();
    ok(&h, &["sandbox", "run", "-a", "owl", "--", "true"]);
    // Another consumer leaves 1 MiB free (the reserve is 2 MiB here).
    let (free, reserve) = mini_letta::audit::reserve::reading(&h).unwrap();
    assert!(reserve >= 2 << 20, "reserve {reserve}");
    let filler = disk.0.path().join("filler");
    // tmpfs allocates on write: written, not just sized.
    let o = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "conv=notrunc"])
        .arg(format!("of={}", filler.display()))
        .arg(format!("count={}", (free >> 20) - 1))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let o = run(&h, &["sandbox", "run", "-a", "owl", "--", "true"]);
    assert!(!o.status.success(), "ran with the disk at its reserve");
    assert!(stderr(&o).contains("reserve"), "{}", stderr(&o));
    // The chain is intact, and verify says what the disk can still take.
    let o = run(&h, &["audit", "verify"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("down to its reserve"), "{}", stderr(&o));
    let o = run(&h, &["audit", "verify", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["disk"]["at_reserve"], json!(true), "{v}");
    assert_eq!(v["disk"]["reserve_bytes"].as_u64(), Some(reserve), "{v}");
    let o = run(&h, &["doctor"]);
    assert!(!o.status.success(), "doctor says healthy: {}", stdout(&o));
    assert!(stdout(&o).contains("down to its reserve"), "{}", stdout(&o));
    std::fs::remove_file(&filler).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    ok(&h, &["sandbox", "run", "-a", "owl", "--", "true"]);
}

/// Issue 45 (5): allowed connections were recorded only in the network
/// log (two files kept), which a tenant's flood of cheap failed attempts
/// rotated away — and with it the record of an upload and `usage`'s egress
/// bytes. A finished connection is now an `egress` audit record with its
/// bytes, which `usage` sums: with the network log gone (what the flood
/// did), usage still shows what the transfer carried.
#[test]
fn a_transfer_stays_in_usage_when_the_network_log_is_gone() {
    if !confinement_or_skip("egress usage") {
        return;
    }
    let d = Daemon::start(&["owl"]);
    let h = d.path();
    let p1 = Server::start("P1");
    allow(h, "owl", &[&format!("localhost:{}", p1.port)]);
    let (code, _body) = status_of(
        h,
        "owl",
        &[],
        &format!("http://localhost:{}/upload", p1.port),
    );
    assert_eq!(code, "200");
    let logged = network_log(h, "owl", 1);
    let rec = find(&logged, "localhost", p1.port, "GET").expect("the connection's record");
    let carried = rec["bytes_up"].as_u64().unwrap() + rec["bytes_down"].as_u64().unwrap();
    assert!(carried > 0, "{rec}");
    let audited = wait_until(10, || {
        audit_records(h)
            .iter()
            .any(|r| r["kind"] == "egress" && r["egress_bytes"].as_u64() == Some(carried))
    });
    assert!(audited, "no egress audit record with {carried} bytes");
    // What a rotation flood does to the network log, at once.
    std::fs::remove_dir_all(h.join("network")).unwrap();
    let o = run(h, &["usage", "-a", "owl", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["agents"][0]["egress_bytes"].as_u64(),
        Some(carried),
        "{v}"
    );
    let o = run(h, &["audit", "verify"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}
