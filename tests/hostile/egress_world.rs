//! The world the egress tests talk to: HTTP servers on the host standing
//! for the outside, a name server that never answers, confined clients
//! (`sandbox run`) that fetch through the proxy, and readers of what the
//! supervisor recorded. Shared by `hostile` (the attacks) and
//! `fair_shares` (the timings that must run alone).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::common::{bin, run, stderr, stdout, wait_until};

/// The proxy endpoint inside every command's network namespace.
pub(crate) const PROXY: &str = "127.0.0.1:3128";

/// An HTTP/1.1 server on the host's loopback: answers every request with
/// `hello from <name> <path>`, and records each request line and `Host`.
pub(crate) struct Server {
    pub(crate) port: u16,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl Server {
    pub(crate) fn start(name: &'static str) -> Self {
        Self::start_on(name, "127.0.0.1".parse().unwrap())
    }

    /// A server on address `ip` of this host.
    pub(crate) fn start_on(name: &'static str, ip: std::net::IpAddr) -> Self {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let log = log.clone();
                std::thread::spawn(move || serve_one(name, stream, &log));
            }
        });
        Self { port, seen }
    }

    /// Request lines seen so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(l, _)| l.clone())
            .collect()
    }

    /// Whether a request for `path` arrived.
    pub(crate) fn saw(&self, path: &str) -> bool {
        self.lines()
            .iter()
            .any(|l| l.split_whitespace().nth(1) == Some(path))
    }

    /// The `Host` header of the request for `path`.
    pub(crate) fn host_of(&self, path: &str) -> Option<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .find(|(l, _)| l.split_whitespace().nth(1) == Some(path))
            .map(|(_, h)| h.clone())
    }
}

pub(crate) fn serve_one(
    name: &str,
    stream: std::net::TcpStream,
    log: &Mutex<Vec<(String, String)>>,
) {
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(20)));
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let mut host = String::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("host")
        {
            host = v.trim().to_string();
        }
    }
    let line = line.trim_end().to_string();
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    log.lock().unwrap().push((line, host));
    let body = if path == "/big" {
        "x".repeat(1 << 20)
    } else {
        format!("hello from {name} {path}\n")
    };
    let mut out = stream;
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// `sandbox run -a AGENT --json -- ARGV`: (exit code, stdout, stderr).
pub(crate) fn confined(home: &Path, agent: &str, argv: &[&str]) -> (i64, String, String) {
    let mut args = vec!["sandbox", "run", "-a", agent, "--json", "--"];
    args.extend_from_slice(argv);
    let o = run(home, &args);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("sandbox run: {e}: {}{}", stdout(&o), stderr(&o)));
    (
        v["exit_code"].as_i64().unwrap_or(-1),
        v["stdout"].as_str().unwrap_or("").to_string(),
        v["stderr"].as_str().unwrap_or("").to_string(),
    )
}

/// `curl` confined as `agent`, through the proxy variables: the body (or
/// the refusal's text) and the HTTP status curl saw.
pub(crate) fn fetch(home: &Path, agent: &str, curl_args: &[&str]) -> (i64, String, String) {
    let mut argv = vec!["curl", "-sS", "--max-time", "20"];
    argv.extend_from_slice(curl_args);
    confined(home, agent, &argv)
}

/// [`fetch`] of one URL, returning the HTTP status curl saw and the body
/// (a refusal's one-line reason).
pub(crate) fn status_of(home: &Path, agent: &str, extra: &[&str], url: &str) -> (String, String) {
    let mut args = vec!["-w", "\n%{http_code}"];
    args.extend_from_slice(extra);
    args.push(url);
    let (_, out, err) = fetch(home, agent, &args);
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
    (code.to_string(), format!("{body}{err}"))
}

pub(crate) fn ok(home: &Path, args: &[&str]) -> String {
    let o = run(home, args);
    assert!(o.status.success(), "{args:?}: {}{}", stdout(&o), stderr(&o));
    stdout(&o)
}

pub(crate) fn allow(home: &Path, agent: &str, entries: &[&str]) {
    let mut args = vec!["agent", "set-network", agent];
    for e in entries {
        args.push("--allow");
        args.push(e);
    }
    ok(home, &args);
}

/// The agent's network log (`agent network-log --json`), once it holds
/// at least `n` records (a record is written when its connection ends).
pub(crate) fn network_log(home: &Path, agent: &str, n: usize) -> Vec<Value> {
    let read = || -> Vec<Value> {
        let o = run(home, &["agent", "network-log", agent, "--json"]);
        assert!(o.status.success(), "network-log: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["records"].as_array().cloned().unwrap_or_default()
    };
    wait_until(10, || read().len() >= n);
    read()
}

pub(crate) fn find<'a>(
    records: &'a [Value],
    host: &str,
    port: u16,
    method: &str,
) -> Option<&'a Value> {
    records
        .iter()
        .find(|r| r["host"] == host && r["port"] == json!(port) && r["method"] == method)
}

/// Start `h`'s supervisor in a mount namespace of its own where
/// `/etc/hosts` is `hosts` and, given one, `/etc/resolv.conf` is `resolv`:
/// the proxy's resolver answers what the test says.
pub(crate) fn start_resolving_with(h: &Path, hosts: &Path, resolv: Option<&Path>) -> Supervised {
    let mounts = match resolv {
        Some(_) => r#"mount --bind "$0" /etc/hosts && mount --bind "$2" /etc/resolv.conf"#,
        None => r#"mount --bind "$0" /etc/hosts"#,
    };
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(r#"{mounts} && exec "$1" supervisor start"#))
        .arg(hosts)
        .arg(bin())
        .args(resolv)
        .env("MINI_LETTA_HOME", h)
        .output()
        .unwrap();
    assert!(o.status.success(), "supervisor start: {}", stderr(&o));
    Supervised(h.to_path_buf())
}

/// A DNS server that never answers: a UDP socket on a loopback address
/// that reads and drops every query (the address it listens on).
pub(crate) fn silent_name_server() -> (std::net::UdpSocket, std::net::IpAddr) {
    for last in 53..80u8 {
        let ip: std::net::IpAddr = format!("127.53.53.{last}").parse().unwrap();
        if let Ok(s) = std::net::UdpSocket::bind((ip, 53)) {
            let r = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while r.recv_from(&mut buf).is_ok() {}
            });
            return (s, ip);
        }
    }
    panic!("no loopback address free for a silent name server");
}

/// Latencies in ms of `n` requests for `url` made one after another by a
/// command confined as `agent`, each through the proxy on a connection of
/// its own (failures are reported with their reply).
pub(crate) fn request_latencies(h: &Path, agent: &str, url: &str, n: usize) -> Vec<f64> {
    let client = r#"
import socket, sys, time
url, n = sys.argv[1], int(sys.argv[2])
host = url.split("/")[2]
for _ in range(n):
    t = time.monotonic()
    s = socket.create_connection(("127.0.0.1", @PROXY_PORT@))
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (url, host)).encode())
    reply = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        reply += b
    s.close()
    ms = (time.monotonic() - t) * 1000
    head = reply.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 200 " not in head:
        print("FAILED %.1f %s" % (ms, reply.decode(errors="replace")[-200:].replace("\n", " ")))
    else:
        print("%.3f" % ms)
"#
    .replace("@PROXY_PORT@", PROXY.rsplit(':').next().unwrap());
    let count = n.to_string();
    let (code, out, err) = confined(h, agent, &["python3", "-c", &client, url, &count]);
    assert_eq!(code, 0, "client failed: {out}{err}");
    let failed: Vec<&str> = out.lines().filter(|l| l.starts_with("FAILED")).collect();
    assert!(
        failed.is_empty(),
        "{} of {n} requests failed: {failed:?}",
        failed.len()
    );
    out.lines().filter_map(|l| l.parse().ok()).collect()
}

/// The 99th percentile of `v` (the largest of fewer than 100).
pub(crate) fn p99(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() as f64 * 0.99).ceil() as usize).clamp(1, s.len()) - 1]
}

/// The audit log's records of the home at `h`.
pub(crate) fn audit_records(h: &Path) -> Vec<Value> {
    std::fs::read_to_string(h.join("audit/audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A home's supervisor, stopped when dropped.
pub(crate) struct Supervised(pub(crate) std::path::PathBuf);

impl Drop for Supervised {
    fn drop(&mut self) {
        let _ = run(&self.0, &["supervisor", "stop", "--timeout", "5"]);
    }
}
