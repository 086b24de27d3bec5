//! The control socket: bind it privately, accept CLI peers (same uid
//! only), and shut down gracefully once a stop is requested.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{UnixListener, UnixStream};

use super::children::Launcher;
use super::connection::serve_frames;
use super::frames_io::split;
use super::pidfile::{PidFile, ensure_private_dir};
use super::state::{Peer, State};
use crate::paths::Home;
use crate::protocol::events::Shutdown;
use crate::protocol::{ErrorCode, Event, ServerFrame};

/// How long children get to finish after a stop before they are killed.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// How long in-flight requests (commits) get once children are gone; model
/// requests are cut off at once by the stop.
const REQUEST_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    PidFile(#[from] super::pidfile::PidFileError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Cluster(#[from] super::cluster::ClusterStartError),
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
}

/// A bound, running supervisor (before its accept loop is driven).
pub struct Bound {
    pub state: Arc<State>,
    listener: UnixListener,
    _pid: PidFile,
    socket: PathBuf,
}

/// Take the home's pid file and bind the control socket (mode 0600 before
/// anyone can connect, inside a 0700 directory).
pub fn bind(home: &Home) -> Result<Bound, ServeError> {
    bind_probing(home, crate::sandbox::report_cache::probe_fresh)
}

/// [`bind`] for a supervisor that serves one command: the home's recent
/// sandbox probe is reused (`sandbox::report_cache`).
pub(crate) fn bind_for_one_command(home: &Home) -> Result<Bound, ServeError> {
    bind_probing(home, crate::sandbox::report_cache::probe_reusing)
}

fn bind_probing(
    home: &Home,
    probe: fn(&Home) -> crate::sandbox::report::SandboxReport,
) -> Result<Bound, ServeError> {
    // A bad cluster configuration stops the start: never run unfenced.
    let cluster = super::cluster::load(home)?;
    ensure_private_dir(&home.run_dir())?;
    let pid = PidFile::acquire(&home.supervisor_pid_file())?;
    if pid.reclaimed {
        tracing::warn!("reclaimed the pid file of a supervisor that did not stop cleanly");
    }
    let socket = home.supervisor_socket();
    let io = |source| ServeError::Io {
        path: socket.clone(),
        source,
    };
    // We hold the pid lock, so any socket file here is a dead supervisor's.
    let _ = std::fs::remove_file(&socket);
    let key = super::control_key::issue(home).map_err(|source| ServeError::Io {
        path: home.control_key_file(),
        source,
    })?;
    let listener = bind_private(&socket).map_err(io)?;
    let launcher = Launcher::start(tokio::runtime::Handle::current()).map_err(io)?;
    if nix::unistd::geteuid().is_root() {
        let uids = crate::store::sandbox_uids(home).unwrap_or_default();
        let n = crate::sandbox::identity::kill_leftovers(&uids);
        if n > 0 {
            tracing::warn!(
                "killed {n} leftover process(es) of this home's agents from an earlier supervisor"
            );
        }
    }
    match crate::sandbox::volume::ensure_mounted(home) {
        Ok(0) => {}
        Ok(n) => tracing::info!("mounted {n} agent quota volume(s)"),
        Err(e) => tracing::error!("cannot mount the agents' quota volumes: {e}"),
    }
    let sandbox = probe(home);
    prune_cgroups(home, &sandbox);
    tracing::info!(level = ?sandbox.level, backend = %sandbox.backend, "sandbox layers probed");
    for m in &sandbox.missing {
        tracing::warn!("sandbox layer missing: {m}");
    }
    if let Err(e) = crate::sandbox::profile::load_all(home) {
        tracing::error!("{e}");
        return Err(ServeError::Io {
            path: home.sandbox_profiles_dir(),
            source: std::io::Error::other(e.to_string()),
        });
    }
    // No audit log, no supervisor: every action is recorded or refused.
    let mut state = State::new(
        home.clone(),
        sandbox,
        launcher,
        super::connection::serve_frames,
    );
    state.accounting = super::accounting::Accounting::start(home)?;
    state.cluster = cluster;
    state.control_key = super::control_key::ControlKey::for_host(key, &state.sandbox);
    Ok(Bound {
        state: Arc::new(state),
        listener,
        _pid: pid,
        socket,
    })
}

/// Bind with the socket's mode set before `bind` makes it reachable.
fn bind_private(path: &std::path::Path) -> std::io::Result<UnixListener> {
    use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen};
    let fd = nix::sys::socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    // fchmod on an unbound socket sets the mode of the inode bind creates.
    nix::sys::stat::fchmod(&fd, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &UnixAddr::new(path)?)?;
    // Belt and braces: fix the mode if the kernel ignored the fchmod.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listen(&fd, Backlog::new(128).unwrap_or(Backlog::MAXCONN))?;
    UnixListener::from_std(std::os::unix::net::UnixListener::from(fd))
}

impl Bound {
    /// Serve until stopped, then shut down gracefully.
    pub async fn serve(self) {
        let Bound {
            state,
            listener,
            _pid,
            socket,
        } = self;
        // What a crashed predecessor left (stale reflection locks, orphan
        // worktrees) is cleaned before any launch can start.
        let home = state.home.clone();
        let _ =
            tokio::task::spawn_blocking(move || crate::reflection::recover::recover(&home)).await;
        super::cluster::start(&state).await;
        super::workers::resume_workers(&state);
        super::heads::spawn_publisher(&state);
        tracing::info!(socket = %socket.display(), pid = std::process::id(), "supervisor listening");
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_control(state.clone(), stream));
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        // Out of descriptors, most likely: give them back a
                        // moment rather than spinning.
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                            _ = state.stop.cancelled() => break,
                        }
                    }
                },
                _ = state.stop.cancelled() => break,
                _ = state.drain.cancelled() => break,
            }
        }
        drop(listener);
        // Unreachable from now on: a client that comes too late starts or
        // finds another supervisor instead of talking to one on its way out.
        let _ = std::fs::remove_file(&socket);
        if state.drain.is_cancelled() && !state.stop.is_cancelled() {
            // Other clients' requests (their turns, the memory workers they
            // started) run to their end, for a while: a turn that never
            // ends must not keep this command, and the home, forever.
            state.requests.close();
            let limit = drain_limit();
            tokio::select! {
                _ = state.requests.wait() => {}
                _ = state.stop.cancelled() => {}
                _ = tokio::time::sleep(limit) => {
                    let why = format!(
                        "stopped waiting after {}s for the work of other commands on this command's supervisor: their turns are stopped, memory-worker instructions not yet applied are kept for the next supervisor",
                        limit.as_secs()
                    );
                    // Only an embedded supervisor drains: this is a message
                    // to the person whose command it ran in, and a record.
                    crate::console::style::eprint_warning(&why);
                    tracing::warn!(requests = state.requests.len(), "{why}");
                }
            }
            state.requests.reopen();
        }
        shutdown(&state).await;
        let st = state.clone();
        let _ = tokio::task::spawn_blocking(move || prune_cgroups(&st.home, &st.sandbox)).await;
        let _ = std::fs::remove_file(&socket);
        tracing::info!("supervisor stopped");
        // `_pid` drops here: the pid file is removed and unlocked last.
    }
}

/// How long a draining supervisor waits for other commands' work: 5
/// minutes, or `MINI_LETTA_DRAIN_SECS`.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(300);

const DRAIN_LIMIT_ENV: &str = "MINI_LETTA_DRAIN_SECS";

fn drain_limit() -> Duration {
    let value = std::env::var(DRAIN_LIMIT_ENV).ok();
    parse_drain_limit(value.as_deref()).unwrap_or_else(|e| {
        tracing::warn!("{e}; waiting at most {}s", DRAIN_LIMIT.as_secs());
        DRAIN_LIMIT
    })
}

/// The drain limit a `MINI_LETTA_DRAIN_SECS` value asks for (whole
/// seconds; unset: [`DRAIN_LIMIT`]).
fn parse_drain_limit(value: Option<&str>) -> Result<Duration, String> {
    match value {
        None => Ok(DRAIN_LIMIT),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| format!("{DRAIN_LIMIT_ENV}={v:?} is not a whole number of seconds")),
    }
}

/// Drop the cgroups left by children of dead supervisors (of any home) and
/// of this one, and the empty ones of this home's agents (see
/// `sandbox::cgroup::sweep`).
fn prune_cgroups(home: &Home, sandbox: &crate::sandbox::report::SandboxReport) {
    if !sandbox.cgroup.available {
        return;
    }
    let agents: Vec<String> = crate::store::list(home)
        .unwrap_or_default()
        .into_iter()
        .map(|a| a.id)
        .collect();
    let n = crate::sandbox::cgroup::sweep(&sandbox.cgroup_info, &agents);
    tracing::debug!(removed = n, "left-over agent cgroups removed");
}

/// Ask children to finish (notice on their channel, SIGTERM), kill those
/// still alive after [`STOP_GRACE`], then let in-flight requests complete.
async fn shutdown(state: &Arc<State>) {
    state.request_stop();
    let live = state.table.lock().map(|t| t.live()).unwrap_or_default();
    if !live.is_empty() {
        tracing::info!(children = live.len(), "asking children to finish");
        if let Ok(ch) = state.channels.lock() {
            for c in ch.values() {
                c.send(&ServerFrame::Event(Event::SupervisorShutdown(Shutdown {
                    grace_ms: STOP_GRACE.as_millis() as u64,
                })));
            }
        }
        for c in &live {
            let _ = super::child_signals::signal_child_tree(
                c.pid,
                c.wrapper_depth,
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        wait_for_children(state, STOP_GRACE).await;
        let left = state.table.lock().map(|t| t.live()).unwrap_or_default();
        for c in &left {
            tracing::warn!(
                child = c.id,
                pid = c.pid,
                "child did not finish in time; killing it"
            );
            let _ = super::child_signals::kill_child_tree(c.pid);
        }
        // Reaped before the sweep below, so their cgroups go with the
        // supervisor instead of being left to the next one.
        wait_for_children(state, KILL_GRACE).await;
    }
    // In-flight requests (commits) complete before we exit.
    state.requests.close();
    let started = Instant::now();
    if tokio::time::timeout(REQUEST_GRACE, state.requests.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            left = state.requests.len(),
            waited = ?started.elapsed(),
            "requests still running at exit"
        );
    }
    // Then, and only then, the agents it owns are given back.
    super::cluster::stop(state).await;
    // Refusals and transfers counted past their rate get their record.
    state.egress.flush_counted().await;
    // Last: what was only queued for the audit log (the children's exits
    // above) is made durable before the process may end.
    if tokio::time::timeout(REQUEST_GRACE, state.accounting.log.flush())
        .await
        .is_err()
    {
        tracing::warn!("the audit log did not take the last records in time");
    }
    super::heads::at_stop(&state.home).await;
}

/// How long a stopping supervisor waits for the children it killed to be
/// reaped.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// Wait until no child is live, or `limit` has passed.
async fn wait_for_children(state: &Arc<State>, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        // Registered before the check, so an exit between the two is not
        // missed.
        let ended = state.child_ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if !state.any_live() {
            return;
        }
        if tokio::time::timeout_at(deadline, ended).await.is_err() {
            return;
        }
    }
}

/// Whether a peer with `peer_uid` may use a supervisor running as `our_uid`.
pub fn peer_allowed(peer_uid: u32, our_uid: u32) -> bool {
    peer_uid == our_uid
}

async fn serve_control(state: Arc<State>, stream: UnixStream) {
    let our = nix::unistd::geteuid().as_raw();
    let refusal = match stream.peer_cred().map(|c| c.uid()) {
        Ok(uid) if peer_allowed(uid, our) => None,
        Ok(uid) => Some(format!(
            "connection refused: peer uid {uid} is not the supervisor's uid {our}"
        )),
        Err(e) => Some(format!(
            "connection refused: cannot read peer credentials: {e}"
        )),
    };
    if let Some(message) = refusal {
        tracing::warn!("{message}");
        refuse(stream, message).await;
        return;
    }
    let (reader, sender) = split(stream, true);
    serve_frames(state, reader, sender, Peer::Cli).await;
}

/// Send one `forbidden` error frame and close politely: drain what the peer
/// sent (briefly) so the close is not a reset that could swallow the frame.
async fn refuse(mut stream: UnixStream, message: String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let frame = crate::protocol::encode(&ServerFrame::Error {
        id: None,
        code: ErrorCode::Forbidden,
        message,
    });
    let _ = stream.write_all(&frame).await;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_limit_is_whole_seconds_or_the_default_with_a_reason() {
        assert_eq!(parse_drain_limit(None), Ok(DRAIN_LIMIT));
        assert_eq!(parse_drain_limit(Some(" 3 ")), Ok(Duration::from_secs(3)));
        assert_eq!(parse_drain_limit(Some("0")), Ok(Duration::ZERO));
        for bad in ["", "-1", "2.5", "5m"] {
            let e = parse_drain_limit(Some(bad)).unwrap_err();
            assert!(e.contains("MINI_LETTA_DRAIN_SECS"), "{e}");
        }
    }
}
