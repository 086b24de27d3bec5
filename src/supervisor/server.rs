//! The supervisor daemon: the control socket, per-connection protocol loops,
//! the children's channels, and graceful shutdown.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, broadcast};

use super::children::{
    ChildState, ChildTable, LaunchSpec, Launcher, ROLES, SharedTable, ended_state,
};
use super::conn::{FrameSender, PassedFds, split};
use super::pidfile::{PidFile, ensure_private_dir};
use super::{policy, rpc, untrusted};
use crate::agent::store;
use crate::paths::Home;
use crate::protocol::events::{ChildEnd, ChildExit, ChildStart, Lagged, Shutdown, TurnNotice};
use crate::protocol::{
    Call, ClientFrame, ErrorBody, ErrorCode, Event, FrameError, Line, Outcome, PROTOCOL_VERSION,
    PeerKind, ServerFrame, SpawnParams, StdioMode, decode_client,
};

/// How long children get to finish after a stop before they are killed.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    PidFile(#[from] super::pidfile::PidFileError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub enum Peer {
    Cli,
    Child {
        id: u64,
        agent: String,
        role: String,
        /// The model recorded at launch; `model.complete` uses no other.
        model: String,
    },
}

impl Peer {
    /// The allow-list column: `"cli"` or the child's recorded role.
    pub fn kind(&self) -> &str {
        match self {
            Peer::Cli => "cli",
            Peer::Child { role, .. } => role,
        }
    }
}

/// State shared by every task of one supervisor.
pub struct State {
    pub home: Home,
    /// Confinement layers of this host, probed at start.
    pub sandbox: crate::sandbox::report::SandboxReport,
    pub started: Instant,
    pub table: SharedTable,
    pub launcher: Launcher,
    pub events: broadcast::Sender<Event>,
    pub stop: Notify,
    stopping: std::sync::atomic::AtomicBool,
    /// Requests being handled; shutdown waits for them (in-flight commits
    /// complete rather than being cut off).
    inflight: AtomicUsize,
    idle: Notify,
    /// Channels to live children, for shutdown notices.
    channels: Mutex<std::collections::HashMap<u64, FrameSender>>,
    /// Per-agent shares of the blocking threads (see `rpc::on_agent_thread`).
    agent_slots: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl State {
    pub fn emit(&self, event: Event) {
        let _ = self.events.send(event);
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// The semaphore bounding `agent`'s blocking work.
    pub fn agent_slots(&self, agent: &str, size: usize) -> Arc<tokio::sync::Semaphore> {
        let mut map = self.agent_slots.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(agent.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(size)))
            .clone()
    }

    pub fn request_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stop.notify_waiters();
        self.stop.notify_one();
    }
}

/// Guard counting one in-flight request.
struct Inflight<'a>(&'a State);

impl<'a> Inflight<'a> {
    fn new(s: &'a State) -> Self {
        s.inflight.fetch_add(1, Ordering::SeqCst);
        Self(s)
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
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
    let run = home.run_dir();
    ensure_private_dir(&run)?;
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
    let listener = bind_private(&socket).map_err(io)?;
    let rt = tokio::runtime::Handle::current();
    let launcher = Launcher::start(rt).map_err(io)?;
    let (events, _) = broadcast::channel(1024);
    if nix::unistd::geteuid().is_root() {
        let n = crate::sandbox::identity::kill_leftovers(home);
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
    let sandbox = crate::sandbox::report::SandboxReport::probe();
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
    let state = Arc::new(State {
        home: home.clone(),
        sandbox,
        started: Instant::now(),
        table: Arc::new(Mutex::new(ChildTable::default())),
        launcher,
        events,
        stop: Notify::new(),
        stopping: Default::default(),
        inflight: AtomicUsize::new(0),
        idle: Notify::new(),
        channels: Mutex::new(Default::default()),
        agent_slots: Mutex::new(Default::default()),
    });
    Ok(Bound {
        state,
        listener,
        _pid: pid,
        socket,
    })
}

/// Bind with the socket's mode set before `bind` makes it reachable.
fn bind_private(path: &std::path::Path) -> std::io::Result<UnixListener> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, bind, listen, socket};
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    // fchmod on an unbound socket sets the mode of the inode bind creates.
    nix::sys::stat::fchmod(&fd, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    let addr = UnixAddr::new(path)?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr)?;
    // Belt and braces: fix the mode if the kernel ignored the fchmod.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listen(
        &fd,
        nix::sys::socket::Backlog::new(128).unwrap_or(nix::sys::socket::Backlog::MAXCONN),
    )?;
    let std_listener = std::os::unix::net::UnixListener::from(fd);
    UnixListener::from_std(std_listener)
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
        tracing::info!(socket = %socket.display(), pid = std::process::id(), "supervisor listening");
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let state = state.clone();
                        tokio::spawn(async move { serve_control(state, stream).await });
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = state.stop.notified() => break,
            }
        }
        shutdown(&state).await;
        prune_cgroups(&state.home, &state.sandbox);
        let _ = std::fs::remove_file(&socket);
        tracing::info!("supervisor stopped");
        // `_pid` drops here: the pid file is removed and unlocked last.
    }
}

/// Drop the empty cgroups of this home's agents (left by an earlier
/// supervisor, or by the children of this one once they are gone).
fn prune_cgroups(home: &Home, sandbox: &crate::sandbox::report::SandboxReport) {
    if !sandbox.cgroup.available {
        return;
    }
    let agents: Vec<String> = crate::agent::store::list(home)
        .unwrap_or_default()
        .into_iter()
        .map(|a| a.id)
        .collect();
    let n = crate::sandbox::cgroup::prune(&sandbox.cgroup_info, &agents);
    tracing::debug!(removed = n, "empty agent cgroups pruned");
}

async fn shutdown(state: &Arc<State>) {
    state.stopping.store(true, Ordering::SeqCst);
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
            let _ = super::children::signal_child_tree(
                c.pid,
                c.wrapper_depth,
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            let any = state
                .table
                .lock()
                .map(|t| !t.live().is_empty())
                .unwrap_or(false);
            if !any {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = state.table.lock().map(|t| t.live()).unwrap_or_default();
        for c in &left {
            tracing::warn!(
                child = c.id,
                pid = c.pid,
                "child did not finish in time; killing it"
            );
            let _ = super::children::kill_child_tree(c.pid);
        }
    }
    // In-flight requests (commits) complete before we exit.
    let deadline = Instant::now() + Duration::from_secs(30);
    while state.inflight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        let _ = tokio::time::timeout(Duration::from_millis(50), state.idle.notified()).await;
    }
}

fn uid_of(stream: &UnixStream) -> std::io::Result<u32> {
    Ok(stream.peer_cred()?.uid())
}

/// Whether a peer with `peer_uid` may use a supervisor running as `our_uid`.
pub fn peer_allowed(peer_uid: u32, our_uid: u32) -> bool {
    peer_uid == our_uid
}

async fn serve_control(state: Arc<State>, stream: UnixStream) {
    let our = nix::unistd::geteuid().as_raw();
    let refusal = match uid_of(&stream) {
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

/// The protocol loop shared by CLI connections and child channels. Boxed:
/// a request handler may start a child whose channel runs this same loop.
pub fn serve_frames(
    state: Arc<State>,
    reader: super::conn::FrameReader,
    sender: FrameSender,
    peer: Peer,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(serve_frames_inner(state, reader, sender, peer))
}

async fn serve_frames_inner(
    state: Arc<State>,
    mut reader: super::conn::FrameReader,
    sender: FrameSender,
    peer: Peer,
) {
    let mut greeted = matches!(peer, Peer::Child { .. });
    let mut subscription: Option<tokio::task::JoinHandle<()>> = None;
    let inflight = Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT_PER_CONNECTION));
    loop {
        // Backpressure: no new request is read while this peer's answers
        // pile up unread; one that never reads is cut off.
        if !sender.room().await {
            report_cut_off(&peer, &sender);
            break;
        }
        let next = tokio::select! {
            next = reader.next() => next,
            _ = sender.cut_off() => {
                report_cut_off(&peer, &sender);
                break;
            }
        };
        let next = match next {
            Ok(Some(n)) => n,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!("connection read error: {e}");
                break;
            }
        };
        let (line, fds, refused) = next;
        let frame = match line {
            Line::TooLarge => Err(FrameError {
                id: None,
                code: ErrorCode::FrameTooLarge,
                message: format!("frame exceeds {} bytes", crate::protocol::MAX_FRAME_BYTES),
            }),
            Line::Frame(bytes) => decode_client(&bytes),
        };
        if refused > 0 {
            // Already closed by the reader; the frame they came with is
            // refused (answered with its id when it had one).
            if let Peer::Child {
                id, agent, role, ..
            } = &peer
            {
                tracing::warn!(child = id, agent = %agent, role = %role, descriptors = refused, "closed descriptors a child tried to pass");
            }
            let id = match &frame {
                Ok(ClientFrame::Request { id, .. }) => Some(*id),
                Ok(_) => None,
                Err(e) => e.id,
            };
            sender.send(&ServerFrame::Error {
                id,
                code: ErrorCode::Forbidden,
                message: format!(
                    "children may not pass descriptors: {refused} closed, the frame they came with refused"
                ),
            });
            continue;
        }
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                sender.send(&e.to_frame());
                continue;
            }
        };
        match frame {
            ClientFrame::Hello {
                version,
                peer: said,
            } => {
                if version != PROTOCOL_VERSION {
                    sender.send(&ServerFrame::Error {
                        id: None,
                        code: ErrorCode::VersionMismatch,
                        message: format!("protocol version {version} is not supported (this supervisor speaks {PROTOCOL_VERSION})"),
                    });
                    continue;
                }
                if let Peer::Child { id, .. } = &peer {
                    if let Ok(mut t) = state.table.lock() {
                        t.mark_running(*id);
                    }
                } else if said == PeerKind::Child {
                    tracing::debug!(
                        "a control-socket peer called itself a child; treated as a CLI"
                    );
                }
                greeted = true;
                sender.send(&ServerFrame::Hello {
                    version: PROTOCOL_VERSION,
                    server: format!("mini-letta {}", env!("CARGO_PKG_VERSION")),
                    pid: std::process::id(),
                });
            }
            ClientFrame::Request { id, call } => {
                if !greeted {
                    sender.send(&ServerFrame::Error {
                        id: Some(id),
                        code: ErrorCode::HelloRequired,
                        message: "send hello with the protocol version first".into(),
                    });
                    continue;
                }
                if matches!(call, Call::Subscribe {}) {
                    // Events name every agent's children: not for children.
                    if let Some(refused) = refuse_by_policy(&peer, &call) {
                        sender.send(&ServerFrame::Response {
                            id,
                            outcome: refused,
                        });
                        continue;
                    }
                    if subscription.is_none() {
                        subscription = Some(forward_events(state.clone(), sender.clone()));
                    }
                    sender.send(&ServerFrame::Response {
                        id,
                        outcome: Outcome::Result(json!({ "subscribed": true })),
                    });
                    continue;
                }
                // Descriptors belong to the frame they came with; any other
                // frame's are closed here (by dropping them).
                let fds = match &call {
                    Call::Spawn(p) if p.stdio == StdioMode::Passed => {
                        fds.into_iter().take(3).collect()
                    }
                    _ => Vec::new(),
                };
                // At most this many requests of one connection run at once:
                // past it we stop reading (the peer waits, nobody else does).
                let permit = tokio::select! {
                    p = inflight.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = sender.cut_off() => {
                        report_cut_off(&peer, &sender);
                        break;
                    }
                };
                let state = state.clone();
                let sender = sender.clone();
                let peer = peer.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let _guard = Inflight::new(&state);
                    let outcome = handle(&state, &peer, id, call, fds, &sender).await;
                    sender.send(&ServerFrame::Response { id, outcome });
                });
            }
        }
    }
    if let Some(s) = subscription {
        s.abort();
    }
}

/// Requests of one connection handled at the same time.
pub const MAX_INFLIGHT_PER_CONNECTION: usize = 64;

fn report_cut_off(peer: &Peer, sender: &FrameSender) {
    if !sender.overflowed() {
        return;
    }
    let limits = format!(
        "answers unread for {:?} or more than {} bytes queued",
        super::conn::MAX_STALL,
        super::conn::MAX_QUEUED_BYTES
    );
    match peer {
        Peer::Child {
            id, agent, role, ..
        } => tracing::warn!(
            child = id,
            agent = %agent,
            role = %role,
            "disconnected a child that does not read its responses ({limits})"
        ),
        Peer::Cli => {
            tracing::warn!("disconnected a control-socket peer that does not read ({limits})")
        }
    }
}

fn forward_events(state: Arc<State>, sender: FrameSender) -> tokio::task::JoinHandle<()> {
    let mut rx = state.events.subscribe();
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(event) => {
                    if !sender.send(&ServerFrame::Event(event)) {
                        break;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    sender.send(&ServerFrame::Event(Event::EventsLagged(Lagged {
                        missed: n,
                    })));
                }
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    })
}

pub fn error(code: ErrorCode, message: impl Into<String>) -> Outcome {
    Outcome::Error(ErrorBody {
        code,
        message: message.into(),
        data: None,
    })
}

async fn handle(
    state: &Arc<State>,
    peer: &Peer,
    id: u64,
    call: Call,
    fds: PassedFds,
    sender: &FrameSender,
) -> Outcome {
    if let Some(refused) = refuse_by_policy(peer, &call) {
        return refused;
    }
    match call {
        Call::Ping {} => Outcome::Result(json!({ "pong": true })),
        Call::Status {} => Outcome::Result(status(state)),
        Call::Ps {} => {
            let rows = state.table.lock().map(|t| t.rows()).unwrap_or_default();
            Outcome::Result(json!({ "children": rows }))
        }
        Call::Stop {} => {
            state.request_stop();
            Outcome::Result(json!({ "stopping": true }))
        }
        Call::Spawn(params) => spawn_child(state, params, fds).await,
        Call::Kill { child, signal } => kill_child(state, child, signal),
        Call::Subscribe {} => Outcome::Result(json!({ "subscribed": true })),
        Call::MemoryCommit {
            paths,
            message,
            agent,
        } => rpc::memory_commit(state, peer, paths, message, agent).await,
        Call::MemoryStatus { agent } => rpc::memory_status(state, peer, agent).await,
        Call::ModelComplete { request } => {
            rpc::model_complete(state, peer, id, request, sender).await
        }
        Call::Log { level, message } => rpc::log(peer, level, &message),
        Call::TurnEvent {
            conversation,
            event,
        } => match peer {
            Peer::Child { id, agent, .. } => {
                state.emit(Event::TurnEvent(TurnNotice {
                    agent: agent.clone(),
                    child: *id,
                    conversation,
                    event,
                }));
                Outcome::Result(json!({}))
            }
            Peer::Cli => error(ErrorCode::Forbidden, policy::refusal("cli", "turn.event")),
        },
    }
}

/// The per-role allow-list (`policy::TABLE`), decided from the identity
/// the connection was made with.
fn refuse_by_policy(peer: &Peer, call: &Call) -> Option<Outcome> {
    let who = peer.kind();
    let method = call.method();
    if policy::allowed(who, method) {
        return None;
    }
    if let Peer::Child { id, agent, .. } = peer {
        tracing::warn!(child = id, agent = %agent, role = who, method, "refused a method outside the role's allow-list");
    }
    Some(error(ErrorCode::Forbidden, policy::refusal(who, method)))
}

fn status(state: &State) -> Value {
    let (live, total) = state
        .table
        .lock()
        .map(|t| (t.live().len(), t.rows().len()))
        .unwrap_or((0, 0));
    json!({
        "running": true,
        "pid": std::process::id(),
        "uptime_ms": state.started.elapsed().as_millis() as u64,
        "home": state.home.root(),
        "socket": state.home.supervisor_socket(),
        "version": env!("CARGO_PKG_VERSION"),
        "protocol": PROTOCOL_VERSION,
        "children": live,
        "children_known": total,
    })
}

fn kill_child(state: &State, child: u64, signal: Option<i32>) -> Outcome {
    let info = state.table.lock().ok().and_then(|t| t.get(child).cloned());
    let Some(info) = info else {
        return error(ErrorCode::NotFound, format!("no child {child}"));
    };
    if !info.is_live() {
        return error(
            ErrorCode::NotFound,
            format!("child {child} has already ended"),
        );
    }
    let sig = signal.unwrap_or(libc::SIGTERM);
    let Ok(sig) = nix::sys::signal::Signal::try_from(sig) else {
        return error(ErrorCode::InvalidParams, format!("{sig} is not a signal"));
    };
    let result = if sig == nix::sys::signal::Signal::SIGKILL {
        super::children::kill_child_tree(info.pid)
    } else {
        super::children::signal_child_tree(info.pid, info.wrapper_depth, sig)
    };
    match result {
        Ok(()) => Outcome::Result(json!({ "signalled": child })),
        Err(e) => error(
            ErrorCode::Internal,
            format!("cannot signal child {child}: {e}"),
        ),
    }
}

async fn spawn_child(state: &Arc<State>, params: SpawnParams, fds: PassedFds) -> Outcome {
    if state.is_stopping() {
        return error(ErrorCode::Unavailable, "the supervisor is stopping");
    }
    if !ROLES.contains(&params.role.as_str()) {
        return error(
            ErrorCode::InvalidParams,
            format!(
                "unknown role {:?} (roles: {})",
                params.role,
                ROLES.join(", ")
            ),
        );
    }
    if params.argv.is_empty() {
        return error(ErrorCode::InvalidParams, "argv must name a program");
    }
    let isolation: crate::sandbox::report::Isolation =
        match params.isolation.as_deref().unwrap_or("strict").parse() {
            Ok(i) => i,
            Err(e) => return error(ErrorCode::InvalidParams, e),
        };
    let (mut record, agent) = match store::find(&state.home, Some(&params.agent)) {
        Ok(found) => found,
        Err(e) => return error(ErrorCode::NotFound, e.to_string()),
    };
    let workspace = params.workspace.as_ref().map(PathBuf::from);
    let plan = match plan_child(
        state,
        &mut record,
        &agent,
        &params.role,
        isolation,
        workspace.as_deref(),
    ) {
        Ok(p) => p,
        Err(o) => return o,
    };
    let stdio = match params.stdio {
        StdioMode::Null => None,
        StdioMode::Passed => {
            let mut it = fds.into_iter();
            match (it.next(), it.next(), it.next()) {
                (Some(i), Some(o), Some(e)) => Some([i, o, e]),
                _ => {
                    return error(
                        ErrorCode::InvalidParams,
                        "stdio \"passed\" needs three descriptors sent with the request",
                    );
                }
            }
        }
    };
    let cwd = match &workspace {
        Some(w) => w.clone(),
        None => agent.dir().to_path_buf(),
    };
    let (ours, theirs) = match std::os::unix::net::UnixStream::pair() {
        Ok(p) => p,
        Err(e) => {
            return error(
                ErrorCode::Internal,
                format!("cannot create the child channel: {e}"),
            );
        }
    };
    let wrapper_depth = plan.wrapper_depth();
    let spec = LaunchSpec {
        agent_id: record.id.clone(),
        agent,
        role: params.role.clone(),
        argv: params.argv.clone(),
        cwd,
        plan,
        stdio,
        channel: OwnedFd::from(theirs),
    };
    let launched = match state.launcher.launch(spec).await {
        Ok(l) => l,
        Err(e) => return error(ErrorCode::Internal, e.to_string()),
    };
    let id = match state.table.lock() {
        Ok(mut t) => t.insert(
            &record.id,
            &params.role,
            launched.pid,
            launched.started,
            wrapper_depth,
        ),
        Err(_) => return error(ErrorCode::Internal, "child table poisoned"),
    };
    // What this child may do is fixed here, from the operator's request
    // and the agent's record; nothing it sends later changes it.
    let peer = Peer::Child {
        id,
        agent: record.id.clone(),
        role: params.role.clone(),
        model: params.model.clone().unwrap_or_else(|| record.model.clone()),
    };
    // The channel.
    let channel = match ours
        .set_nonblocking(true)
        .and_then(|()| UnixStream::from_std(ours))
    {
        Ok(s) => s,
        Err(e) => return error(ErrorCode::Internal, format!("child channel: {e}")),
    };
    let (reader, sender) = split(channel, false);
    if let Ok(mut ch) = state.channels.lock() {
        ch.insert(id, sender.clone());
    }
    let st = state.clone();
    tokio::spawn(serve_frames(st, reader, sender, peer));

    // Output of children without passed stdio goes to our log.
    let mut child = launched.child;
    for (stream, name) in [
        (
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            "stdout",
        ),
        (
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            "stderr",
        ),
    ] {
        if let Some(s) = stream {
            tokio::spawn(async move {
                // Quoted and capped: a child's output cannot pose as a
                // supervisor record, nor grow our memory without bound.
                untrusted::for_each_line(s, untrusted::MAX_LINE, |line, cut| {
                    tracing::info!(child = id, stream = name, cut, text = ?line, "child output");
                })
                .await;
            });
        }
    }
    // The reaper.
    let st = state.clone();
    let (agent_id, role, pid) = (record.id.clone(), params.role.clone(), launched.pid);
    tokio::spawn(async move {
        let ended = match child.wait().await {
            Ok(status) => ended_state(status),
            Err(e) => {
                tracing::warn!(child = id, "cannot wait for child: {e}");
                ChildState::Exited { code: -1 }
            }
        };
        if let Ok(mut t) = st.table.lock() {
            t.mark_ended(id, ended.clone());
        }
        if let Ok(mut ch) = st.channels.lock() {
            ch.remove(&id);
        }
        match &ended {
            ChildState::Killed { signal } => {
                tracing::warn!(child = id, agent = %agent_id, role = %role, pid, signal, "child killed by a signal")
            }
            ChildState::Exited { code } if *code != 0 => {
                tracing::warn!(child = id, agent = %agent_id, role = %role, pid, code, "child failed")
            }
            _ => tracing::info!(child = id, agent = %agent_id, role = %role, pid, "child exited"),
        }
        let end = match ended {
            ChildState::Killed { signal } => ChildEnd::Killed { signal },
            ChildState::Exited { code } => ChildEnd::Exited { code },
            // An ended child is never starting or running.
            ChildState::Starting | ChildState::Running => ChildEnd::Exited { code: -1 },
        };
        st.emit(Event::ChildExit(ChildExit {
            child: id,
            agent: agent_id,
            role,
            pid,
            end,
        }));
    });
    state.emit(Event::ChildStart(ChildStart {
        child: id,
        agent: record.id.clone(),
        role: params.role.clone(),
        pid: launched.pid,
    }));
    Outcome::Result(
        json!({ "child": id, "pid": launched.pid, "agent": record.id, "role": params.role }),
    )
}

/// Prepare an agent for a confined child (uid, ownership, cgroup) and plan
/// its launch; refuse when the isolation asked for cannot be met.
fn plan_child(
    state: &State,
    record: &mut crate::agent::record::AgentRecord,
    agent: &crate::paths::AgentPaths,
    role: &str,
    isolation: crate::sandbox::report::Isolation,
    workspace: Option<&std::path::Path>,
) -> Result<crate::sandbox::plan::LaunchPlan, Outcome> {
    use crate::sandbox::{cgroup, identity, plan, profile, report::Isolation};
    let internal = |e: &dyn std::fmt::Display| error(ErrorCode::Internal, e.to_string());
    let exe = std::env::current_exe().map_err(|e| internal(&e))?;
    if isolation == Isolation::Off {
        tracing::warn!(agent = %record.id, role, "ISOLATION OFF: starting a child without confinement, as requested");
    }
    let profile = profile::load(&state.home, role)
        .map_err(|e| error(ErrorCode::InvalidParams, e.to_string()))?;
    let resolved = profile.resolve(agent, workspace, None);
    let report = &state.sandbox;
    let confined = isolation != Isolation::Off;
    let mut uid = None;
    if confined && report.uid_switch.available {
        let u = identity::ensure_uid(&state.home, record, agent).map_err(|e| internal(&e))?;
        identity::make_traversable(&state.home).map_err(|e| internal(&e))?;
        identity::check_reachable(
            &super::children::stage_exe(&exe),
            "run",
            "install mini-letta where every user can run it (e.g. /usr/local/bin)",
        )
        .map_err(|e| internal(&e))?;
        identity::own_agent_dir(agent, u).map_err(|e| internal(&e))?;
        uid = Some(u);
    } else if confined {
        std::fs::create_dir_all(agent.tmp_dir()).map_err(|e| internal(&e))?;
    }
    let mut launch = plan::plan(&plan::PlanInput {
        report,
        isolation,
        home: state.home.root(),
        agent_dir: agent.dir(),
        agent_id: &record.id,
        tmp_dir: &agent.tmp_dir(),
        resolved: &resolved,
        exe: &exe,
        stage_exe: &super::children::stage_exe(&exe),
        uid,
    })
    .map_err(|e| error(ErrorCode::Unavailable, e.to_string()))?;
    if confined && report.level != crate::sandbox::report::Level::L0 {
        tracing::warn!(level = ?report.level, "child runs below L0: {}", report.missing.join("; "));
    }
    if confined && report.cgroup.available {
        launch.cgroup_procs =
            cgroup::prepare(&report.cgroup_info, &record.id, role, &resolved.limits)
                .map_err(|e| internal(&e))?;
    }
    Ok(launch)
}
