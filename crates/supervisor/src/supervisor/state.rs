//! What every task of one supervisor shares: the child table, the event
//! bus, the stop signal and the tracker of requests in flight; and who is
//! on the other end of a connection ([`Peer`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{Notify, Semaphore, broadcast};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::children::{Launcher, SharedTable};
use super::frames_io::{FrameReader, FrameSender};
use crate::paths::Home;
use crate::protocol::{ErrorBody, ErrorCode, Event, Outcome};

/// Who is on the other end of a connection. Fixed when the connection is
/// made (a CLI on the control socket, a child on the channel it was
/// launched with); nothing the peer sends changes it.
#[derive(Debug, Clone)]
pub enum Peer {
    Cli,
    Child {
        id: u64,
        agent: String,
        role: String,
        /// The model recorded at launch; `model.complete` uses no other.
        model: String,
        /// A sub-agent's memory worktree (its name under
        /// `memory-worktrees/`): where its `memory.commit` lands.
        worktree: Option<String>,
        /// The isolation it was launched with (sub-agents it starts get
        /// the same).
        isolation: Option<String>,
        /// The conversation a turn child was started for (a recall
        /// sub-agent it delegates to forks this one, and no other).
        conversation: Option<String>,
    },
}

impl Peer {
    /// What the child table says of the child that called `method` — its
    /// agent, isolation and conversation; `forbidden` for any other peer.
    #[allow(clippy::type_complexity)]
    pub fn agent_child(
        &self,
        method: &str,
    ) -> Result<(&String, &Option<String>, &Option<String>), Outcome> {
        match self {
            Peer::Child {
                agent,
                isolation,
                conversation,
                ..
            } => Ok((agent, isolation, conversation)),
            _ => Err(error(
                ErrorCode::Forbidden,
                format!("{method} comes from agent children only"),
            )),
        }
    }

    /// The allow-list column: `"cli"` or the child's recorded role.
    pub fn kind(&self) -> &str {
        match self {
            Peer::Cli => "cli",
            Peer::Child { role, .. } => role,
        }
    }
}

/// The protocol loop a launched child's channel runs
/// (`connection::serve_frames`). It is handed to the state at bind rather
/// than imported by the launcher: the loop dispatches requests, and some
/// of those launch children, so the launcher sits below it.
pub type ServeChannel = fn(
    Arc<State>,
    FrameReader,
    FrameSender,
    Peer,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// State shared by every task of one supervisor.
pub struct State {
    pub home: Home,
    /// Confinement layers of this host, probed at start.
    pub sandbox: crate::sandbox::report::SandboxReport,
    pub started: Instant,
    pub table: SharedTable,
    pub launcher: Launcher,
    /// What serves a launched child's channel.
    pub serve_channel: ServeChannel,
    pub events: broadcast::Sender<Event>,
    /// Cancelled once a stop is requested: the accept loop ends, new
    /// children are refused, shutdown begins.
    pub stop: CancellationToken,
    /// Cancelled when an embedded supervisor's owner is done: no new
    /// connection or request is taken, the requests of other clients that
    /// share it run to their end, then it stops (nobody's turn is killed).
    pub drain: CancellationToken,
    /// Requests being handled; shutdown waits for them (in-flight commits
    /// complete rather than being cut off).
    pub requests: TaskTracker,
    /// Woken whenever a child ends (shutdown waits on it, not on a timer).
    pub child_ended: Notify,
    /// Requests received on the control socket (`supervisor.status` shows
    /// it: how many trips the CLI costs is measured, not guessed).
    pub cli_requests: std::sync::atomic::AtomicU64,
    /// Ids for control-socket connections (a CLI's memory lease is its
    /// connection's).
    next_connection: std::sync::atomic::AtomicU64,
    /// Channels to live children, for shutdown notices.
    pub(super) channels: Mutex<HashMap<u64, FrameSender>>,
    /// Turns in flight, one per conversation, and their cancel tokens.
    pub turns: super::turns::Turns,
    /// Who may edit each agent's memory working tree right now.
    pub leases: super::leases::Leases,
    /// Per-agent shares of the blocking threads (see [`on_agent_thread`]).
    agent_slots: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// What a control connection must present (see [`super::control_key`]).
    pub control_key: super::control_key::ControlKey,
    /// Sub-agents' tasks and reports, by child id (`task.get`/`task.finish`).
    pub tasks: Mutex<HashMap<u64, TaskEntry>>,
    /// Reflections and memory workers in flight, per agent.
    pub subagents: Running,
    /// The audit log's appender, budgets and usage figures.
    pub accounting: super::accounting::Accounting,
    /// The egress proxy: children's endpoints, limits, the network log.
    pub egress: Arc<crate::egress::serve::Egress>,
    /// Several hosts (issue 35): who owns which agent, through etcd.
    pub cluster: crate::cluster::Handle,
    /// Turn children started ahead of their turn (`warm`).
    pub warm: super::warm_pool::WarmPool,
}

/// A sub-agent's task as recorded at launch, and the report it left.
#[derive(Debug, Clone)]
pub struct TaskEntry {
    pub task: crate::protocol::task::SubagentTask,
    pub report: Option<String>,
}

/// Per agent: the running reflection and memory worker (child ids; `0`
/// while one is being prepared), and the worker instructions waiting for
/// their turn (each also kept on disk until its worker is finalized).
#[derive(Debug, Default)]
pub struct AgentSubagents {
    pub reflection: Option<u64>,
    pub worker: Option<u64>,
    pub queued_workers: VecDeque<crate::reflection::queue::QueuedWorker>,
    /// A reflection branch the agent is reviewing (explicit mode).
    pub integration: Option<PendingIntegration>,
}

/// Sub-agents in flight, by agent id.
#[derive(Debug, Default)]
pub struct Running {
    inner: Mutex<HashMap<String, AgentSubagents>>,
}

impl Running {
    /// Run `f` on the agent's entry.
    pub fn with<T>(&self, agent: &str, f: impl FnOnce(&mut AgentSubagents) -> T) -> T {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(agent.to_string()).or_default();
        f(entry)
    }
}

/// A reflection branch the agent is reviewing (explicit mode): only that
/// branch, only from that conversation, may be merged by `memory.merge`.
#[derive(Debug, Clone)]
pub struct PendingIntegration {
    pub conversation: String,
    pub worktree: String,
    pub branch: String,
    pub summary: String,
    pub merge: Option<crate::protocol::replies::Merged>,
}

impl State {
    pub fn new(
        home: Home,
        sandbox: crate::sandbox::report::SandboxReport,
        launcher: Launcher,
        serve_channel: ServeChannel,
    ) -> Self {
        let (events, _) = broadcast::channel(1024);
        State {
            egress: Arc::new(crate::egress::serve::Egress::new(home.clone())),
            home,
            sandbox,
            started: Instant::now(),
            table: Default::default(),
            launcher,
            serve_channel,
            events,
            stop: CancellationToken::new(),
            drain: CancellationToken::new(),
            requests: TaskTracker::new(),
            child_ended: Notify::new(),
            cli_requests: Default::default(),
            next_connection: Default::default(),
            channels: Mutex::new(HashMap::new()),
            turns: Default::default(),
            leases: Default::default(),
            agent_slots: Mutex::new(HashMap::new()),
            tasks: Mutex::new(HashMap::new()),
            control_key: Default::default(),
            subagents: Default::default(),
            accounting: super::accounting::Accounting::with_log(crate::audit::Log::off()),
            cluster: Default::default(),
            warm: Default::default(),
        }
    }

    /// A fresh connection id.
    pub(crate) fn connection_id(&self) -> u64 {
        self.next_connection
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1
    }

    pub fn emit(&self, event: Event) {
        let _ = self.events.send(event);
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    pub(crate) fn request_stop(&self) {
        self.stop.cancel();
    }

    /// The semaphore bounding `agent`'s blocking work.
    pub(crate) fn agent_slots(&self, agent: &str, size: usize) -> Arc<Semaphore> {
        let mut map = self.agent_slots.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(agent.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(size)))
            .clone()
    }

    /// Whether any child is starting or running.
    pub(crate) fn any_live(&self) -> bool {
        self.table
            .lock()
            .map(|t| !t.live().is_empty())
            .unwrap_or(false)
    }
}

/// The connection a request came on: its id and a token cancelled when
/// it closes.
#[derive(Clone)]
pub struct Connection {
    pub id: u64,
    pub gone: CancellationToken,
}

/// A failed request's outcome.
pub fn error(code: ErrorCode, message: impl Into<String>) -> Outcome {
    Outcome::Error(ErrorBody {
        code,
        message: message.into(),
        data: None,
    })
}

/// Blocking work (git, files, model calls) one agent may have running at
/// once; more waits for a slot, so one agent whose work hangs cannot take
/// the blocking threads every other agent needs.
pub const MAX_BLOCKING_PER_AGENT: usize = 8;

/// Run `f` on a blocking thread within `agent`'s share of them.
pub(crate) async fn on_agent_thread<T, F>(state: &State, agent: &str, f: F) -> Result<T, String>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let slots = state.agent_slots(agent, MAX_BLOCKING_PER_AGENT);
    let permit = slots.acquire_owned().await.map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        f()
    })
    .await
    .map_err(|e| e.to_string())
}

/// Run blocking work (file system, git, chown, agent lookup) off the
/// async workers; a panic in it becomes an internal error.
pub async fn blocking<T, F>(f: F) -> Result<T, Outcome>
where
    F: FnOnce() -> Result<T, Outcome> + Send + 'static,
    T: Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(error(
            ErrorCode::Internal,
            format!("blocking task failed: {e}"),
        )),
    }
}
