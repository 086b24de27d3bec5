//! The supervisor: one process per home that owns every memory repository,
//! lock, secret and child. CLIs attach over `<home>/run/supervisor.sock`;
//! children talk over the socketpair they were started with.
//!
//! A one-shot command that needs a supervisor and finds none runs one
//! *embedded*, in-process, for its own duration: the same [`listener`] code on
//! a background runtime, bound to the same socket, stopped when the command
//! ends.

pub mod children;
pub mod conn;
pub mod connection;
pub mod dispatch;
pub mod launch;
pub mod listener;
pub mod pidfile;
pub mod policy;
pub mod rpc;
pub mod state;
pub mod untrusted;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::paths::Home;
use crate::protocol::Call;
use crate::protocol::client::{Client, ClientError};

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(transparent)]
    Serve(#[from] listener::ServeError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot start the supervisor: {0}")]
    Spawn(std::io::Error),
    #[error("the supervisor did not answer within {0:?}; see {1}")]
    StartTimeout(Duration, String),
    #[error("the supervisor exited during start-up ({status}); see {log}")]
    StartFailed { status: String, log: String },
    #[error("the supervisor (pid {0}) did not stop within {1:?}")]
    StopTimeout(u32, Duration),
    #[error("cannot protect the supervisor's memory: {0}; refusing to hold its secrets")]
    Harden(String),
}

fn runtime() -> Result<tokio::runtime::Runtime, SupervisorError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("supervisor")
        .build()
        .map_err(SupervisorError::Runtime)
}

/// Run a supervisor in this process until it is stopped (by
/// `supervisor.stop`, SIGTERM or SIGINT).
pub fn run_foreground(home: &Home) -> Result<(), SupervisorError> {
    harden_self()?;
    let rt = runtime()?;
    rt.block_on(async {
        let bound = listener::bind(home)?;
        let state = bound.state.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                tracing::warn!(
                    "cannot install signal handlers; stop with `mini-letta supervisor stop`"
                );
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("signal received: stopping");
            state.request_stop();
        });
        bound.serve().await;
        Ok(())
    })
}

/// Make this process's memory and environment unreadable to same-uid
/// processes (`/proc/<pid>/environ`, ptrace) and disable core dumps.
/// Checked and read back: without namespaces (L2) this is what keeps a
/// child of the same uid out of the supervisor's `/proc` entries.
fn harden_self() -> Result<(), SupervisorError> {
    let fail = |what: &str, e: nix::errno::Errno| SupervisorError::Harden(format!("{what}: {e}"));
    nix::sys::prctl::set_dumpable(false).map_err(|e| fail("prctl(PR_SET_DUMPABLE, 0)", e))?;
    if nix::sys::prctl::get_dumpable().map_err(|e| fail("prctl(PR_GET_DUMPABLE)", e))? {
        return Err(SupervisorError::Harden(
            "still dumpable after PR_SET_DUMPABLE 0".into(),
        ));
    }
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
        .map_err(|e| fail("setrlimit(RLIMIT_CORE, 0)", e))
}

/// Whether a supervisor answers on this home's socket.
pub fn connect(home: &Home) -> Result<Client, ClientError> {
    Client::connect(&home.supervisor_socket())
}

/// Outcome of [`start_daemon`].
#[derive(Debug)]
pub enum Started {
    New(u32),
    AlreadyRunning(u32),
}

/// Start a background supervisor for `home` unless one runs; return once its
/// control socket answers.
pub fn start_daemon(home: &Home, timeout: Duration) -> Result<Started, SupervisorError> {
    if let Ok(c) = connect(home) {
        return Ok(Started::AlreadyRunning(c.server_pid));
    }
    pidfile::ensure_private_dir(&home.run_dir()).map_err(listener::ServeError::from)?;
    let log_path = home.run_dir().join("supervisor.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(SupervisorError::Spawn)?;
    let log_err = log.try_clone().map_err(SupervisorError::Spawn)?;
    let exe = std::env::current_exe().map_err(SupervisorError::Spawn)?;
    let mut cmd = Command::new(exe);
    cmd.arg("--home")
        .arg(home.root())
        .args(["supervisor", "start", "--foreground"])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our
    // terminal and process group (a failure is reported by spawn).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(SupervisorError::Spawn)?;
    let child_pid = child.id();
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(c) = connect(home) {
            // Reap the intermediate handle in the background; the daemon
            // keeps running on its own.
            std::thread::spawn(move || child.wait());
            return Ok(if c.server_pid == child_pid {
                Started::New(c.server_pid)
            } else {
                Started::AlreadyRunning(c.server_pid)
            });
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Lost a race with another start? Then that one answers.
            if let Ok(c) = connect(home) {
                return Ok(Started::AlreadyRunning(c.server_pid));
            }
            return Err(SupervisorError::StartFailed {
                status: status.to_string(),
                log: log_path.display().to_string(),
            });
        }
        if Instant::now() > deadline {
            return Err(SupervisorError::StartTimeout(
                timeout,
                log_path.display().to_string(),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stop the home's supervisor: ask politely, wait, then signal. Returns the
/// pid that was stopped, or `None` when none was running.
pub fn stop(home: &Home, timeout: Duration) -> Result<Option<u32>, SupervisorError> {
    let pid_file = home.supervisor_pid_file();
    let pid = match connect(home) {
        Ok(mut c) => {
            let pid = c.server_pid;
            let _ = c.call(Call::Stop {});
            Some(pid)
        }
        Err(_) => pidfile::PidFile::holder(&pid_file),
    };
    let Some(pid) = pid else { return Ok(None) };
    let gone = |deadline: Instant| {
        while Instant::now() < deadline {
            if pidfile::PidFile::holder(&pid_file).is_none() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    };
    if gone(Instant::now() + timeout) {
        return Ok(Some(pid));
    }
    let target = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM);
    if gone(Instant::now() + timeout) {
        return Ok(Some(pid));
    }
    tracing::warn!(
        pid,
        "supervisor ignored the stop request and SIGTERM; killing it"
    );
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
    if gone(Instant::now() + Duration::from_secs(5)) {
        return Ok(Some(pid));
    }
    Err(SupervisorError::StopTimeout(pid, timeout))
}

/// A connection to a supervisor, and the embedded one if we had to start it.
pub struct Session {
    pub client: Client,
    embedded: Option<std::thread::JoinHandle<()>>,
    home: Home,
}

impl Session {
    /// Connect to the running supervisor, or run one embedded.
    pub fn open(home: &Home) -> Result<Self, SupervisorError> {
        if let Ok(client) = connect(home) {
            return Ok(Self {
                client,
                embedded: None,
                home: home.clone(),
            });
        }
        // This process now holds the supervisor's secrets too.
        harden_self()?;
        let (tx, rx) = std::sync::mpsc::channel::<Result<(), SupervisorError>>();
        let h = home.clone();
        let thread = std::thread::Builder::new()
            .name("embedded-supervisor".into())
            .spawn(move || {
                let rt = match runtime() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                rt.block_on(async {
                    match listener::bind(&h) {
                        Ok(bound) => {
                            let _ = tx.send(Ok(()));
                            bound.serve().await;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e.into()));
                        }
                    }
                });
            })
            .map_err(SupervisorError::Spawn)?;
        match rx.recv() {
            Ok(Ok(())) => {
                tracing::debug!("no supervisor running: started an embedded one");
                let client = connect(home)?;
                Ok(Self {
                    client,
                    embedded: Some(thread),
                    home: home.clone(),
                })
            }
            // Somebody else bound first: use theirs.
            Ok(Err(SupervisorError::Serve(listener::ServeError::PidFile(_)))) => {
                let _ = thread.join();
                Ok(Self {
                    client: connect(home)?,
                    embedded: None,
                    home: home.clone(),
                })
            }
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(SupervisorError::Runtime(std::io::Error::other(
                    "embedded supervisor failed to start",
                )))
            }
        }
    }

    pub fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    /// Stop the embedded supervisor (if any) and wait for it.
    pub fn close(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if let Some(thread) = self.embedded.take() {
            if let Ok(mut c) = connect(&self.home) {
                let _ = c.call(Call::Stop {});
            }
            let _ = thread.join();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.finish();
    }
}

/// True when `path` names a live supervisor socket.
pub fn socket_answers(path: &Path) -> bool {
    Client::connect(path).is_ok()
}
