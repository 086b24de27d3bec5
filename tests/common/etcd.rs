//! A real etcd cluster for the tests: three members (Debian's `etcd-server`)
//! on loopback, random free ports, temporary data directories, fast
//! elections; killed (and removed) on drop. Members can be killed one by
//! one to take the quorum away.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One member: its client URL, how it is started, and its process
/// (`None` while killed).
pub struct Member {
    pub name: String,
    pub client_url: String,
    args: Vec<String>,
    child: Option<Child>,
}

/// A three-member etcd cluster on loopback.
pub struct Etcd {
    pub members: Vec<Member>,
    bin: PathBuf,
    _data: tempfile::TempDir,
}

/// The etcd server binary, when installed.
pub fn binary() -> Option<PathBuf> {
    ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// A port nobody listens on right now (the listener is closed again; the
/// member binds it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

impl Etcd {
    /// Start three members and wait until the cluster answers (`None`,
    /// after a loud skip, when etcd is not installed).
    pub fn start(test: &str) -> Option<Self> {
        let Some(bin) = binary() else {
            super::skip(&format!(
                "{test}: etcd is not installed (apt-get install etcd-server)"
            ));
            return None;
        };
        // A port picked free can be taken by someone else before the member
        // binds it (tests start clusters in parallel): a cluster that never
        // became healthy is started once more on fresh ports.
        match Self::start_on_fresh_ports(&bin) {
            Ok(etcd) => Some(etcd),
            Err(first) => {
                eprintln!("etcd did not become healthy, starting it again:\n{first}");
                match Self::start_on_fresh_ports(&bin) {
                    Ok(etcd) => Some(etcd),
                    Err(logs) => panic!("the etcd cluster did not become healthy: {logs}"),
                }
            }
        }
    }

    /// Three members on ports free a moment ago; `Err(logs)` when they do
    /// not answer within 30 s (they are killed on drop).
    fn start_on_fresh_ports(bin: &std::path::Path) -> Result<Self, String> {
        let bin = bin.to_path_buf();
        let data = tempfile::tempdir().unwrap();
        let peers: Vec<(String, u16, u16)> = (0..3)
            .map(|i| (format!("m{i}"), free_port(), free_port()))
            .collect();
        let initial: Vec<String> = peers
            .iter()
            .map(|(n, _, p)| format!("{n}=http://127.0.0.1:{p}"))
            .collect();
        let initial = initial.join(",");
        let token = format!("mini-letta-test-{}", std::process::id());
        let mut members = Vec::new();
        for (name, client, peer) in &peers {
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let data_dir = data.path().join(name).display().to_string();
            let args: Vec<String> = [
                "--name",
                name,
                "--data-dir",
                &data_dir,
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &initial,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                &token,
                // Fast elections: a killed leader is replaced in about a
                // second, and leases may be as short as two seconds.
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect();
            members.push(Member {
                name: name.clone(),
                client_url,
                args,
                child: None,
            });
        }
        let mut etcd = Self {
            members,
            bin,
            _data: data,
        };
        for i in 0..3 {
            etcd.restart(i);
        }
        if etcd.wait_healthy(Duration::from_secs(30)) {
            Ok(etcd)
        } else {
            Err(etcd.logs())
        }
    }

    /// The comma-separated client URLs (`MINI_LETTA_ETCD`), of every member.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| m.client_url.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Whether `etcdctl endpoint health` passes for every live member.
    pub fn wait_healthy(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let live: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| m.client_url.clone())
            .collect();
        while Instant::now() < deadline {
            let o = self.ctl(&live.join(","), &["endpoint", "health"]);
            if o.status.success() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// `etcdctl` (API v3) against `endpoints`.
    pub fn ctl(&self, endpoints: &str, args: &[&str]) -> std::process::Output {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoints, "--command-timeout", "3s"])
            .args(args)
            .output()
            .unwrap()
    }

    /// The value of `key` read from the live members ("" when absent).
    pub fn get(&self, key: &str) -> String {
        let live: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| m.client_url.clone())
            .collect();
        let o = self.ctl(&live.join(","), &["get", "--print-value-only", key]);
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// (Re)start member `i` with its data directory: a member killed
    /// before rejoins the cluster (its data says it is a member already).
    pub fn restart(&mut self, i: usize) {
        if self.members[i].child.is_some() {
            return;
        }
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self._data.path().join(format!("{}.log", m.name)))
            .unwrap();
        let child = Command::new(&self.bin)
            .args(&m.args)
            .env_remove("ETCD_NAME")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.members[i].child = Some(child);
    }

    /// Lose every member's data (issue 43 §3): all killed, their data
    /// directories removed, the same members started as a new cluster —
    /// its revisions begin again from 1. Waits until it answers.
    pub fn wipe(&mut self) {
        // A first bootstrap that has not converged in 30 s (a loaded
        // machine, elections of 500 ms) is wiped and started once more:
        // the ports must stay, the hosts under test know them.
        for attempt in 0..2 {
            for i in 0..self.members.len() {
                self.kill(i);
            }
            for m in &self.members {
                let _ = std::fs::remove_dir_all(self._data.path().join(&m.name));
            }
            for i in 0..self.members.len() {
                self.restart(i);
            }
            if self.wait_healthy(Duration::from_secs(30)) {
                return;
            }
            eprintln!("the wiped etcd cluster did not become healthy (attempt {attempt})");
        }
        panic!(
            "the wiped etcd cluster did not become healthy: {}",
            self.logs()
        );
    }

    /// Stop member `i` (SIGSTOP): it keeps its connections and answers
    /// nothing, as a frozen or paused host would.
    pub fn freeze(&self, i: usize, frozen: bool) {
        if let Some(c) = &self.members[i].child {
            let sig = if frozen {
                nix::sys::signal::Signal::SIGSTOP
            } else {
                nix::sys::signal::Signal::SIGCONT
            };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// The index of the member that leads now, by its own word.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| {
            let o = self.ctl(&m.client_url, &["endpoint", "status", "-w", "json"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            let status = &v[0]["Status"];
            let (me, leader) = (&status["header"]["member_id"], &status["leader"]);
            !me.is_null() && me == leader
        })
    }

    /// Whether member `i` runs.
    pub fn is_up(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// Kill member `i` (SIGKILL) and reap it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Every member's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for m in &self.members {
            let p = self._data.path().join(format!("{}.log", m.name));
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            all.push_str(&format!("--- {} ---\n", m.name));
            for l in tail.into_iter().rev() {
                all.push_str(l);
                all.push('\n');
            }
        }
        all
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
