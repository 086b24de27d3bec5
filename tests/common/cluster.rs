//! Two hosts in one etcd cluster sharing a directory remote (issue 35):
//! each host a home and a host id; commands run with the cluster in their
//! environment, supervisors started in the background and woken (SIGCONT)
//! and stopped on drop.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

use super::etcd::Etcd;
use super::{bin, open_home, stderr, stdout};

/// The lease the hosts hold (seconds): short, so a failover is quick.
pub const LEASE: u64 = 3;

/// One host: a home and its host id.
pub struct Host {
    pub home: tempfile::TempDir,
    pub id: &'static str,
    /// More environment for its commands and supervisor.
    pub env: Vec<(String, String)>,
}

/// Two hosts, a remote root and the etcd cluster they share.
pub struct Hosts {
    pub etcd: Etcd,
    pub root: tempfile::TempDir,
    pub a: Host,
    pub b: Host,
}

impl Hosts {
    pub fn new(etcd: Etcd) -> Self {
        Self {
            etcd,
            root: tempfile::tempdir().unwrap(),
            a: Host {
                home: open_home(),
                id: "host-a",
                env: Vec::new(),
            },
            b: Host {
                home: open_home(),
                id: "host-b",
                env: Vec::new(),
            },
        }
    }

    /// `mini-letta ARGS` as `host`, its environment naming the cluster.
    pub fn on(&self, host: &Host, args: &[&str]) -> Output {
        self.command(host, args).output().unwrap()
    }

    pub fn command(&self, host: &Host, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args)
            .env("MINI_LETTA_HOME", host.home.path())
            .env("MINI_LETTA_REMOTE_ROOT", self.root.path())
            .env("MINI_LETTA_ETCD", self.etcd.endpoints())
            .env("MINI_LETTA_HOST_ID", host.id)
            .env("MINI_LETTA_LEASE_SECS", LEASE.to_string())
            .env_remove("RUST_LOG");
        for (k, v) in &host.env {
            c.env(k, v);
        }
        c
    }

    /// Start `host`'s supervisor in the background; its pid.
    pub fn start(&self, host: &Host) -> u32 {
        let o = self.on(host, &["supervisor", "start"]);
        assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
        let home = mini_letta::paths::Home::at(host.home.path());
        mini_letta::supervisor::connect(&home).unwrap().server_pid
    }

    pub fn chat(&self, host: &Host, extra: &[&str], text: &str) -> Output {
        let mut args = vec!["chat", "-a", "agent-demo"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-p", text]);
        self.on(host, &args)
    }

    pub fn status(&self, host: &Host) -> Value {
        let o = self.on(host, &["cluster", "status", "--json"]);
        assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    pub fn bare(&self, id: &str) -> PathBuf {
        self.root.path().join(format!("{id}.git"))
    }

    /// `path` of the remote's `main`.
    pub fn remote_file(&self, id: &str, path: &str) -> String {
        let o = Command::new("git")
            .arg("--git-dir")
            .arg(self.bare(id))
            .args(["show", &format!("main:{path}")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn owner_key(&self, id: &str) -> String {
        self.etcd.get(&format!("/mini-letta/agents/{id}/owner"))
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for host in [&self.a, &self.b] {
            let home = mini_letta::paths::Home::at(host.home.path());
            // A stopped supervisor must be woken before it can stop.
            if let Some(pid) =
                mini_letta::supervisor::pidfile::PidFile::holder(&home.supervisor_pid_file())
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
            let _ = self.on(host, &["supervisor", "stop", "--timeout", "5"]);
        }
    }
}

pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}
