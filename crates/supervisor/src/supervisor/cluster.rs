//! The supervisor's side of a cluster (issue 35): its node, started with it
//! and given back at a clean stop; the ownership gate before a turn, a sync
//! or an operator's memory edit; the take-over a new owner runs before
//! anything else; fenced syncs; and `agent.release`.
//!
//! Without `[cluster]` / `MINI_LETTA_ETCD` every function here lets
//! everything through unchanged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::leases::LEASE_WAIT;
use super::state::{State, blocking, error};
use crate::cluster::{ClusterConfig, ClusterError, Handle, Node, Owned};
use crate::memfs::fence::{Fence, Stamp};
use crate::memfs::sync::{SyncError, SyncOutcome, SyncStatus};
use crate::paths::AgentPaths;
use crate::protocol::replies;
use crate::protocol::{ErrorCode, Outcome};
use crate::store;
use crate::store::record::AgentRecord;

#[derive(Debug, thiserror::Error)]
pub enum ClusterStartError {
    #[error(transparent)]
    Config(#[from] ClusterError),
    #[error(
        "a clustered supervisor needs the shared remote: set {} (acknowledged memory must be durable elsewhere)",
        crate::memfs::sync::REMOTE_ROOT_ENV
    )]
    NoRemote,
}

/// The home's cluster configuration; a cluster without a remote root is
/// refused (nothing could be fenced or made durable).
pub fn load(home: &crate::paths::Home) -> Result<Handle, ClusterStartError> {
    let config = ClusterConfig::load(home)?;
    if config.is_some() && crate::remote::root_from_env().is_none() {
        return Err(ClusterStartError::NoRemote);
    }
    Ok(Handle::new(config))
}

/// Join the cluster, when one is configured (the lease is granted and kept
/// in the background).
pub async fn start(state: &Arc<State>) {
    let Some(cfg) = state.cluster.config().cloned() else {
        return;
    };
    // Owner changes are records of the audit log (the soak checks them).
    let log = state.accounting.log.clone();
    let recorder: crate::cluster::Recorder = Arc::new(move |change| {
        let log = log.clone();
        Box::pin(async move { super::audit_records::owner_changed(&log, change).await })
    });
    // An etcd without an epoch base (new, or wiped) gets one past every
    // fence in the remote before any take (issue 43 §3).
    let home = state.home.clone();
    let scan: crate::cluster::node::FenceScan = Arc::new(move || {
        let root = crate::remote::root_from_env().ok_or("no remote root")?;
        let fences = crate::remote::fences(&home, &root).map_err(|e| e.to_string())?;
        Ok(crate::remote::largest_fence_epoch(&fences))
    });
    match Node::start(cfg, recorder, scan).await {
        Ok(node) => state.cluster.joined(node),
        // Every ownership request is then refused, naming etcd.
        Err(e) => tracing::error!("cannot join the cluster: {e}"),
    }
}

/// At a clean stop: give the lease back, and with it every agent owned.
pub async fn stop(state: &Arc<State>) {
    if let Some(node) = state.cluster.node() {
        node.shutdown().await;
    }
}

/// How long a one-shot command's supervisor waits for its first lease.
fn registration_wait(node: &Node) -> Duration {
    Duration::from_secs(node.config().lease_secs + 2)
}

/// Before anything changes agent `agent`'s memory or conversations: own
/// it. `Ok` when this host owns it (after taking the remote over, when it
/// just took it); otherwise a refusal naming the owner host or etcd. With
/// `wait`, another owner (or etcd) is waited for that long.
pub async fn own(state: &Arc<State>, agent: &str, wait: Option<Duration>) -> Result<(), Outcome> {
    if !state.cluster.enabled() {
        return Ok(());
    }
    let Some(node) = state.cluster.node().cloned() else {
        return Err(refusal(
            agent,
            "",
            &ClusterError::Etcd {
                endpoints: String::new(),
                what: "could not be joined".into(),
                message: "see the supervisor's log".into(),
            },
        ));
    };
    let gate = state.cluster.gate(agent);
    let _one_at_a_time = gate.lock().await;
    let began = Instant::now();
    let deadline = began + wait.unwrap_or_default().max(registration_wait(&node));
    let waited = began + wait.unwrap_or_default();
    // Not registered yet (a supervisor just started): its lease comes
    // within moments; etcd without quorum, or another owner: only with
    // `wait` — otherwise refused now (fail closed, in bounded time).
    let may_wait = |failure: &ClusterError| {
        let until = match failure {
            ClusterError::NotOwner { .. } => waited,
            ClusterError::Etcd { .. } if !node.has_registered() => deadline,
            // Most often this host's previous supervisor, whose lease is
            // about to expire: waited out like a first registration.
            ClusterError::HostIdInUse(_) if !node.has_registered() => deadline,
            ClusterError::Etcd { .. } => waited,
            _ => return false,
        };
        Instant::now() < until && !state.is_stopping()
    };
    let poll = crate::retry::Policy::polling(Duration::from_millis(200), deadline - began);
    match poll.run_async(may_wait, || node.own(agent)).await {
        Ok(Owned::Already(_)) => Ok(()),
        Ok(Owned::Taken(epoch)) => take_over(state, &node, agent, epoch).await,
        Err(failure) => Err(refusal(agent, node.host_id(), &failure)),
    }
}

/// The error a refused caller gets (`host`: this one's id).
fn refusal(agent: &str, host: &str, e: &ClusterError) -> Outcome {
    let message = match e {
        // Its own id under another lease: its previous supervisor's (killed,
        // its lease not yet expired), or a key someone wrote by hand.
        ClusterError::NotOwner { owner, .. } if owner == host => format!(
            "agent {agent} is owned by host {owner}, this host's id, under a lease that is not this supervisor's (a previous supervisor's, until it expires: wait with `chat --wait-owner SECS`)"
        ),
        ClusterError::NotOwner { owner, .. } => format!(
            "agent {agent} is owned by host {owner}: it runs there (wait for it with `chat --wait-owner SECS`, or release it there with `agent release`)"
        ),
        ClusterError::Etcd { .. } => {
            format!("refusing to change agent {agent} unfenced: {e}")
        }
        other => format!("cannot own agent {agent}: {other}"),
    };
    error(ErrorCode::Unavailable, message)
}

/// A new owner's first step: the fenced take-over sync (the remote's
/// memory becomes `main`, this host's claim is pushed). On failure the
/// agent is given back, so another host may have it.
async fn take_over(
    state: &Arc<State>,
    node: &Arc<Node>,
    agent: &str,
    epoch: i64,
) -> Result<(), Outcome> {
    let lease = state
        .leases
        .hold(agent, LEASE_WAIT)
        .await
        .map_err(|e| error(ErrorCode::Unavailable, e.to_string()))?;
    let (home, id) = (state.home.clone(), agent.to_string());
    let fence = NodeFence {
        node: node.clone(),
        agent: agent.to_string(),
        epoch,
        fence_epoch: node.fence_epoch(agent).unwrap_or(epoch),
        takeover: true,
    };
    let root = crate::remote::root_from_env();
    let synced = blocking(move || {
        let run = || -> Result<SyncOutcome, SyncError> {
            let paths = home.agent(&id)?;
            let record = load_record(&paths)?;
            crate::remote::sync_agent_fenced(&paths, &record, root.as_deref(), Some(&fence))
        };
        Ok(run())
    })
    .await?;
    drop(lease);
    let why = match synced {
        Ok(out) if matches!(out.status, SyncStatus::Pushed | SyncStatus::Clean) => {
            tracing::info!(agent, epoch, message = %out.message, "took the agent over");
            return Ok(());
        }
        Ok(out) => out.message,
        Err(e) => e.to_string(),
    };
    if let Err(e) = node.release(agent).await {
        tracing::warn!(
            agent,
            "cannot give the agent back after a failed take-over: {e}"
        );
    }
    Err(error(
        ErrorCode::Unavailable,
        format!("cannot take agent {agent} over from the remote: {why}"),
    ))
}

fn load_record(paths: &AgentPaths) -> Result<AgentRecord, SyncError> {
    store::load(paths).map_err(|e| SyncError::Io {
        path: paths.agent_json(),
        source: std::io::Error::other(e.to_string()),
    })
}

/// How a sync of one agent is fenced.
pub enum Fencing {
    /// No cluster.
    Off,
    On(NodeFence),
    /// This host does not own the agent (any more): no sync may push.
    Lost(String),
}

/// The fencing of a sync of `agent` now (this host's own record; the push
/// itself confirms with etcd).
pub fn fencing(state: &State, agent: &str) -> Fencing {
    if !state.cluster.enabled() {
        return Fencing::Off;
    }
    let Some(node) = state.cluster.node() else {
        return Fencing::Lost("this supervisor could not join the cluster".into());
    };
    match (node.epoch(agent), node.fence_epoch(agent)) {
        (Some(epoch), Some(fence_epoch)) => Fencing::On(NodeFence {
            node: node.clone(),
            agent: agent.to_string(),
            epoch,
            fence_epoch,
            takeover: false,
        }),
        _ => Fencing::Lost(format!(
            "host {} no longer holds it (its etcd lease expired or another host took it)",
            node.host_id()
        )),
    }
}

/// [`crate::remote::sync_agent`] under `fencing` (blocking).
pub(crate) fn sync_agent(
    paths: &AgentPaths,
    record: &AgentRecord,
    root: Option<&str>,
    fencing: &Fencing,
) -> Result<SyncOutcome, SyncError> {
    match fencing {
        Fencing::Off => crate::remote::sync_agent(paths, record, root),
        Fencing::On(f) => crate::remote::sync_agent_fenced(paths, record, root, Some(f)),
        Fencing::Lost(why) => crate::memfs::sync::ownership_lost(paths, why),
    }
}

/// In a cluster, a turn that committed is acknowledged only once its
/// memory is on the remote: `synced` (the sync after the turn) must have
/// pushed it (or found nothing to push).
pub fn acknowledged(state: &State, synced: Option<&replies::SyncOutcome>) -> Result<(), Outcome> {
    if !state.cluster.enabled() {
        return Ok(());
    }
    let Some(s) = synced else {
        return Ok(());
    };
    if s.status.is_settled() {
        return Ok(());
    }
    Err(error(
        ErrorCode::Unavailable,
        format!(
            "the turn's memory was not pushed, so it is not acknowledged: {}",
            s.message
        ),
    ))
}

/// `agent.release`: give an agent this host owns back.
pub async fn release(state: &Arc<State>, agent: Option<String>) -> Outcome {
    let Some(node) = state.cluster.node().cloned() else {
        return error(
            ErrorCode::Unavailable,
            "this supervisor is not in a cluster (set MINI_LETTA_ETCD or [cluster] etcd)",
        );
    };
    let st = state.clone();
    let found = blocking(move || {
        store::find(&st.home, agent.as_deref())
            .map_err(|e| error(ErrorCode::NotFound, e.to_string()))
    })
    .await;
    let (record, _) = match found {
        Ok(f) => f,
        Err(o) => return o,
    };
    // Not while one of its turns or syncs is changing it.
    let lease = match state.leases.hold(&record.id, LEASE_WAIT).await {
        Ok(l) => l,
        Err(e) => return error(ErrorCode::Unavailable, e.to_string()),
    };
    let released = node.release(&record.id).await;
    drop(lease);
    match released {
        Ok(()) => Outcome::reply(&replies::AgentReleased {
            agent: record.id,
            name: record.name,
            released: true,
            host: node.host_id().to_string(),
        }),
        Err(ClusterError::NotOwner { owner, .. }) => error(
            ErrorCode::Forbidden,
            format!(
                "agent {} is owned by host {owner}, not this one ({}): release it there",
                record.name,
                node.host_id()
            ),
        ),
        Err(e) => error(ErrorCode::Unavailable, e.to_string()),
    }
}

/// A sync's fence for an agent this host owns: its stamp, and etcd's word
/// before each push.
pub struct NodeFence {
    node: Arc<Node>,
    agent: String,
    /// The take's revision: what etcd confirms.
    epoch: i64,
    /// What the fence is stamped with: the epoch plus the epoch base.
    fence_epoch: i64,
    takeover: bool,
}

impl Fence for NodeFence {
    fn stamp(&self) -> Stamp {
        Stamp {
            host: self.node.host_id().to_string(),
            epoch: self.fence_epoch,
        }
    }

    fn confirm(&self) -> Result<(), String> {
        self.node
            .confirm_blocking(&self.agent, self.epoch)
            .map_err(|e| e.to_string())
    }

    fn takeover(&self) -> bool {
        self.takeover
    }
}
