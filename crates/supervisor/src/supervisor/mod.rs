//! The supervisor: one process per home that owns every memory repository,
//! lock, secret and child. CLIs attach over `<home>/run/supervisor.sock`;
//! children talk over the socketpair they were started with.
//!
//! A one-shot command that needs a supervisor and finds none runs one
//! *embedded*, in-process, for its own duration: the same [`listener`] code on
//! a background runtime, bound to the same socket, stopped when the command
//! ends.

pub mod accounting;
pub mod audit_records;
pub mod autosync;
pub mod child_signals;
pub mod children;
pub mod cluster;
pub mod connection;
pub mod control_key;
pub mod dispatch;
pub mod frames_io;
pub mod heads;
#[cfg(test)]
mod instruction_tests;
pub mod integration;
pub mod launch;
pub mod leases;
pub mod listener;
pub mod pidfile;
pub mod policy;
pub mod recall_delegate;
pub mod reflect;
pub mod rpc;
pub mod state;
pub mod subagent_child;
pub mod sync_repair;
pub mod tasks;
mod turn_child;
pub mod turn_run;
mod turn_slot;
pub mod turns;
pub mod untrusted;
pub mod warm;
pub mod warm_pool;
pub mod workers;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::paths::Home;
use crate::protocol::Call;
use crate::protocol::client::{Client, ClientError};
use crate::retry::Policy;

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
    #[error("the supervisor exited during start-up ({status}){}; see {log}",
        cause.as_deref().map(|c| format!(": {c}")).unwrap_or_default())]
    StartFailed {
        status: String,
        log: String,
        /// The error it logged last, when there is one.
        cause: Option<String>,
    },
    #[error("the supervisor (pid {0}) did not stop within {1:?}")]
    StopTimeout(u32, Duration),
    #[error("cannot protect the supervisor's memory: {0}; refusing to hold its secrets")]
    Harden(String),
}

/// A request or turn a draining supervisor did not take is sent again, at
/// once, to the next one: up to three times.
pub const RESEND_NOT_TAKEN: crate::retry::Policy = crate::retry::Policy::immediate(4);

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
    let served = rt.block_on(async {
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
    });
    // Blocking threads still in a provider's request are not waited for.
    rt.shutdown_timeout(Duration::from_millis(500));
    served
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
    let log_path = home.supervisor_log();
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
    // Until its socket answers, or it ends without (a start that failed,
    // or lost a race with another start, which then answers).
    let mut answered = None;
    let mut ended = None;
    let settled = Policy::polling(START_POLL, timeout).wait_for(|| {
        if let Ok(c) = connect(home) {
            answered = Some(c.server_pid);
        } else if let Ok(Some(status)) = child.try_wait() {
            answered = connect(home).ok().map(|c| c.server_pid);
            ended = Some(status);
        }
        answered.is_some() || ended.is_some()
    });
    match (answered, ended) {
        (Some(pid), None) => {
            // Reap the intermediate handle in the background; the daemon
            // keeps running on its own.
            std::thread::spawn(move || child.wait());
            Ok(if pid == child_pid {
                Started::New(pid)
            } else {
                Started::AlreadyRunning(pid)
            })
        }
        (Some(pid), Some(_)) => Ok(Started::AlreadyRunning(pid)),
        (None, Some(status)) => Err(SupervisorError::StartFailed {
            status: status.to_string(),
            log: log_path.display().to_string(),
            cause: last_error(&log_path),
        }),
        (None, None) => {
            debug_assert!(!settled);
            Err(SupervisorError::StartTimeout(
                timeout,
                log_path.display().to_string(),
            ))
        }
    }
}

/// How often a command waiting for a supervisor that another command is
/// starting or finishing looks again.
const SHARED_START_POLL: Duration = Duration::from_millis(15);

/// How often a starting or stopping command looks at the supervisor's
/// socket or pid file.
const START_POLL: Duration = Duration::from_millis(10);

/// The last error a supervisor that failed to start wrote to its log
/// (its own words, from the end of the file; control characters dropped).
fn last_error(log: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    const PREFIX: &str = "mini-letta: error: ";
    let mut f = std::fs::File::open(log).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(8192))).ok()?;
    let mut tail = Vec::new();
    f.take(8192).read_to_end(&mut tail).ok()?;
    let text = String::from_utf8_lossy(&tail);
    let line = text.lines().rev().find_map(|l| l.strip_prefix(PREFIX))?;
    Some(line.chars().filter(|c| !c.is_control()).collect())
}

/// How a stop went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It stopped when asked.
    Clean(u32),
    /// It ignored the request and stopped on SIGTERM.
    Terminated(u32),
    /// It had to be killed (SIGKILL); its files were removed for it.
    Killed(u32),
}

impl Stopped {
    pub fn pid(self) -> u32 {
        match self {
            Stopped::Clean(p) | Stopped::Terminated(p) | Stopped::Killed(p) => p,
        }
    }
}

/// Stop the home's supervisor: ask, wait up to `timeout`, then SIGTERM,
/// then SIGKILL (a short wait each). However it ends, its pid and socket
/// files are gone afterwards. `None` when none was running.
pub fn stop(home: &Home, timeout: Duration) -> Result<Option<Stopped>, SupervisorError> {
    let pid_file = home.supervisor_pid_file();
    let pid = match connect(home) {
        Ok(mut c) => {
            let pid = c.server_pid;
            let _ = c.call_as::<crate::protocol::replies::Stopping>(Call::Stop {});
            Some(pid)
        }
        Err(_) => pidfile::PidFile::holder(&pid_file),
    };
    let Some(pid) = pid else {
        remove_stale_files(home);
        return Ok(None);
    };
    let alive = || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
            && pidfile::PidFile::holder(&pid_file) == Some(pid)
    };
    let gone = |limit: Duration| Policy::polling(START_POLL, limit).wait_for(|| !alive());
    if gone(timeout) {
        remove_stale_files(home);
        return Ok(Some(Stopped::Clean(pid)));
    }
    let target = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM);
    if gone(Duration::from_secs(2)) {
        remove_stale_files(home);
        return Ok(Some(Stopped::Terminated(pid)));
    }
    // `supervisor stop` reports the kill itself (`Stopped::Killed`).
    tracing::info!(
        pid,
        "supervisor ignored the stop request and SIGTERM; killing it"
    );
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
    if gone(Duration::from_secs(5)) {
        remove_stale_files(home);
        return Ok(Some(Stopped::Killed(pid)));
    }
    Err(SupervisorError::StopTimeout(pid, timeout))
}

/// Remove the pid and socket files of a supervisor that is gone (only
/// when no live supervisor holds the pid file's lock).
pub(crate) fn remove_stale_files(home: &Home) {
    if let Ok(held) = pidfile::PidFile::acquire(&home.supervisor_pid_file()) {
        // We hold the lock: nobody serves the socket.
        let _ = std::fs::remove_file(home.supervisor_socket());
        drop(held);
    }
}

/// How long a one-shot command waits for another process's supervisor of
/// the same home to come up, or to finish the turns it still runs.
pub const SHARED_START_WAIT: Duration = Duration::from_secs(600);

/// A connection to a supervisor, and the embedded one if we had to start it.
///
/// One supervisor per home, always: a command that finds one running uses
/// it; one that finds another process starting one (its pid file is held
/// but its socket does not answer yet) waits for it; only a command that
/// takes the pid file itself runs one embedded. When such a command is
/// done, its supervisor stops taking new work, lets the turns of other
/// commands that share it finish, then goes; a command that reaches it
/// too late finds no socket and starts (or finds) the next one.
pub struct Session {
    pub client: Client,
    embedded: Option<Embedded>,
}

struct Embedded {
    thread: std::thread::JoinHandle<()>,
    state: std::sync::Arc<state::State>,
}

impl Session {
    /// Connect to the home's supervisor, or run one embedded.
    pub fn open(home: &Home) -> Result<Self, SupervisorError> {
        let began = Instant::now();
        let mut told = false;
        let mut once = || {
            if let Ok(client) = connect(home) {
                return Ok(Some(Self {
                    client,
                    embedded: None,
                }));
            }
            if let Some(session) = Self::try_embedded(home)? {
                return Ok(Some(session));
            }
            // Another process holds the pid file: it is starting, or
            // finishing its last turns. Its socket answers soon, or it goes.
            if !told && began.elapsed() > Duration::from_secs(2) {
                told = true;
                // The user's own message (this runs in the CLI's process).
                crate::console::style::eprint_warning(&format!(
                    "waiting for the supervisor of {} (another command is starting or finishing it)",
                    home.root().display()
                ));
            }
            Ok::<_, SupervisorError>(None)
        };
        let mut opened = Ok(None);
        Policy::polling(SHARED_START_POLL, SHARED_START_WAIT).wait_for(|| {
            opened = once();
            !matches!(opened, Ok(None))
        });
        opened?.ok_or_else(|| {
            SupervisorError::StartTimeout(
                SHARED_START_WAIT,
                home.supervisor_log().display().to_string(),
            )
        })
    }

    /// Start an embedded supervisor, or `None` when another process holds
    /// the home's pid file.
    fn try_embedded(home: &Home) -> Result<Option<Self>, SupervisorError> {
        // This process now holds the supervisor's secrets too.
        harden_self()?;
        // Its records are the daemon's kind, from the first (the sandbox
        // probe's, as it binds) on: they go where the daemon's go unless
        // the user asked to see them (issue 44: a layer missing for a user
        // was warned on every command's stderr).
        if pidfile::ensure_private_dir(&home.run_dir()).is_ok() {
            crate::console::logging::divert_quiet_records(&home.supervisor_log());
        }
        type Ready = Result<std::sync::Arc<state::State>, SupervisorError>;
        let (tx, rx) = std::sync::mpsc::channel::<Ready>();
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
                    match listener::bind_for_one_command(&h) {
                        Ok(bound) => {
                            // It ends with its command: a child started
                            // for a next turn would only be killed.
                            bound.state.warm.disable();
                            let _ = tx.send(Ok(bound.state.clone()));
                            bound.serve().await;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e.into()));
                        }
                    }
                });
                rt.shutdown_timeout(Duration::from_millis(500));
            })
            .map_err(SupervisorError::Spawn)?;
        match rx.recv() {
            Ok(Ok(state)) => {
                tracing::debug!("no supervisor running: started an embedded one");
                let client = match connect(home) {
                    Ok(c) => c,
                    Err(e) => {
                        state.request_stop();
                        let _ = thread.join();
                        return Err(e.into());
                    }
                };
                Ok(Some(Self {
                    client,
                    embedded: Some(Embedded { thread, state }),
                }))
            }
            Ok(Err(SupervisorError::Serve(listener::ServeError::PidFile(
                pidfile::PidFileError::Running { .. },
            )))) => {
                let _ = thread.join();
                Ok(None)
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

    /// One request on a session of its own, closed after. A request a
    /// draining supervisor did not take (`not_taken`) is sent again on a
    /// new session (the next supervisor) ([`RESEND_NOT_TAKEN`]).
    pub fn call_once<R: serde::de::DeserializeOwned>(
        home: &Home,
        call: Call,
    ) -> Result<R, SupervisorError> {
        let not_taken = |e: &SupervisorError| {
            let again = matches!(e, SupervisorError::Client(c)
                if c.code() == Some(crate::protocol::ErrorCode::NotTaken));
            if again {
                tracing::debug!("{e}; sending it again");
            }
            again
        };
        let once = || {
            let mut session = Self::open(home)?;
            let result = session.client.call_as(call.clone());
            session.close();
            Ok(result?)
        };
        RESEND_NOT_TAKEN.run(not_taken, once)
    }

    pub fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    /// A handle that stops the embedded supervisor from another thread
    /// (a signal handler), when this session runs one.
    pub fn stopper(&self) -> Option<Stopper> {
        self.embedded.as_ref().map(|e| Stopper {
            state: e.state.clone(),
        })
    }

    /// Stop the embedded supervisor (if any) and wait for it: other
    /// commands' turns on it finish first.
    pub fn close(mut self) {
        self.finish(false);
    }

    /// Stop the embedded supervisor now (a signal ends the command): its
    /// children are stopped, its pid and socket files removed.
    pub fn abort(mut self) {
        self.finish(true);
    }

    fn finish(&mut self, now: bool) {
        if let Some(e) = self.embedded.take() {
            if now {
                e.state.request_stop();
            } else {
                e.state.drain.cancel();
            }
            let _ = e.thread.join();
        }
    }
}

/// Stops an embedded supervisor from outside the session that owns it.
#[derive(Clone)]
pub struct Stopper {
    state: std::sync::Arc<state::State>,
}

impl Stopper {
    /// Stop it now (children stopped, files removed) and wait, at most
    /// `timeout`, until its pid file is gone.
    pub fn stop_and_wait(&self, timeout: Duration) -> bool {
        self.state.request_stop();
        let pid_file = self.state.home.supervisor_pid_file();
        Policy::polling(START_POLL, timeout).wait_for(|| !pid_file.exists())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.finish(false);
    }
}
