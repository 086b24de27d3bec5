//! Supervisor-owned operations requested by peers: validated memory commits,
//! memory status, model calls and child log lines. A child may act only on
//! its own agent; its identity comes from its channel, never from the frame.

use std::sync::Arc;

use serde_json::Value;

use super::frames_io::FrameSender;
use super::leases::{Holder, LEASE_WAIT};
use super::state::{Connection, Peer, State, blocking, error, on_agent_thread};
use crate::memfs::commit::{CommitError, CommitOptions, commit_paths};
use crate::memfs::repo;
use crate::model::{
    ModelError, ModelEvent, ModelRequest, ModelResponse, ProviderConfig, open_model,
};
use crate::protocol::events::{ModelDelta, TurnDelta};
use crate::protocol::{
    Committed, ErrorBody, ErrorCode, Event, LogLevel, Outcome, ServerFrame, replies,
};
use crate::store;

/// The agent a request acts on: a child's own agent (a different `agent`
/// parameter is refused), or for a CLI the named one.
fn target_agent(peer: &Peer, asked: Option<String>) -> Result<String, Outcome> {
    match peer {
        Peer::Child { agent, .. } => match asked {
            Some(a) if &a != agent => Err(error(
                ErrorCode::Forbidden,
                format!("refused: this child belongs to agent {agent} and cannot act for {a}"),
            )),
            _ => Ok(agent.clone()),
        },
        Peer::Cli => asked.ok_or_else(|| {
            error(
                ErrorCode::InvalidParams,
                "params.agent is required on the control socket",
            )
        }),
    }
}

pub async fn memory_commit(
    state: &Arc<State>,
    peer: &Peer,
    conn: &Connection,
    paths: Vec<String>,
    message: String,
    agent: Option<String>,
) -> Outcome {
    let agent = match target_agent(peer, agent) {
        Ok(a) => a,
        Err(o) => return o,
    };
    if message.trim().is_empty() {
        return error(ErrorCode::InvalidParams, "a commit message is required");
    }
    let agent = match agent_id(state, peer, agent).await {
        Ok(a) => a,
        Err(o) => return o,
    };
    let worktree = match commit_worktree(peer) {
        Ok(w) => w,
        Err(o) => return o,
    };
    // A commit to the checkout is a memory write: it waits for whoever
    // else edits this agent's memory, unless the caller is that child
    // itself. Nobody else writes a sub-agent's worktree.
    let holder = worktree.is_some() || state.leases.holds(holder(peer, conn));
    let _lease = if holder {
        None
    } else {
        match state.leases.hold(&agent, LEASE_WAIT).await {
            Ok(g) => Some(g),
            Err(e) => return error(ErrorCode::Unavailable, e.to_string()),
        }
    };
    let home = state.home.clone();
    let audited = crate::audit::Entry::new(
        crate::audit::kind::COMMIT,
        Some(&agent),
        Some(super::audit_records::role_of(peer)),
    )
    .with("paths", paths.clone())
    .with("message", message.clone())
    .with("worktree", worktree.clone());
    let result = on_agent_thread(
        state,
        &agent.clone(),
        move || -> Result<Committed, Outcome> {
            let (record, agent_paths) = store::find(&home, Some(&agent))
                .map_err(|e| error(ErrorCode::NotFound, e.to_string()))?;
            let repo = match &worktree {
                Some(name) => crate::memfs::worktree::open(&agent_paths, name)
                    .map(|(_, repo)| repo)
                    .map_err(|e| error(ErrorCode::Forbidden, e.to_string()))?,
                None => repo::open_agent(&agent_paths)
                    .map_err(|e| error(ErrorCode::Internal, e.to_string()))?,
            };
            let author = store::agent_signature(&record)
                .map_err(|e| error(ErrorCode::Internal, e.to_string()))?;
            // Children never get the human approval for constraint changes.
            let opts = CommitOptions::for_repo(&repo, false);
            match commit_paths(&repo, &paths, &message, &author, &opts) {
                Ok(outcome) => Ok(Committed {
                    commit: outcome.commit.map(|c| c.to_string()),
                    changed: outcome.changed,
                }),
                Err(e) => Err(commit_refusal(e)),
            }
        },
    )
    .await;
    match result {
        Ok(Ok(committed)) => {
            // A commit is acknowledged once it is in the log.
            if let Some(sha) = &committed.commit {
                let entry = audited
                    .with("sha", sha.as_str())
                    .with("changed", committed.changed.clone());
                if let Err(o) = super::audit_records::record(state, entry).await {
                    return o;
                }
            }
            Outcome::reply(&committed)
        }
        Ok(Err(o)) => o,
        Err(e) => error(ErrorCode::Internal, format!("commit task failed: {e}")),
    }
}

/// The worktree a commit lands on: a sub-agent commits on its own
/// worktree's branch — the one recorded when it was launched, never one it
/// names; everyone else on the checkout.
fn commit_worktree(peer: &Peer) -> Result<Option<String>, Outcome> {
    match peer {
        Peer::Child { role, worktree, .. }
            if matches!(role.as_str(), "reflection" | "memory-worker") =>
        {
            match worktree {
                Some(name) => Ok(Some(name.clone())),
                None => Err(error(
                    ErrorCode::Forbidden,
                    "this sub-agent was launched without a worktree: it has nowhere to commit",
                )),
            }
        }
        _ => Ok(None),
    }
}

/// A refused commit as the caller hears it: the validator's report, a
/// path or size the caller chose (forbidden), a lock held past the bounded
/// wait (unavailable), anything else internal.
fn commit_refusal(e: CommitError) -> Outcome {
    match e {
        CommitError::Rejected(report) => Outcome::Error(ErrorBody {
            code: ErrorCode::ValidationFailed,
            message: report.render_block(),
            data: serde_json::to_value(replies::Violations {
                violations: report.messages().into_iter().map(str::to_string).collect(),
            })
            .ok(),
        }),
        e @ (CommitError::Path(_)
        | CommitError::GitDirPath(_)
        | CommitError::ThroughSymlink { .. }
        | CommitError::SymlinkOutside { .. }
        | CommitError::CaseCollision { .. }
        | CommitError::NotADirectory { .. }
        | CommitError::NoSuchPath(_)
        | CommitError::NoPaths
        | CommitError::NotAFile(_)
        | CommitError::TooLarge { .. }
        | CommitError::TooMuch { .. }
        | CommitError::Changed(_)) => error(ErrorCode::Forbidden, e.to_string()),
        // Another writer held the repository for the whole bounded wait.
        e @ CommitError::Lock(crate::memfs::lock::LockError::Timeout { .. }) => {
            error(ErrorCode::Unavailable, e.to_string())
        }
        e => error(ErrorCode::Internal, e.to_string()),
    }
}

/// `memory.lease`: the caller alone edits the agent's memory until it
/// releases, or exits (a child) or disconnects (a CLI).
pub(crate) async fn memory_lease(
    state: &Arc<State>,
    peer: &Peer,
    agent: Option<String>,
    conn: &Connection,
) -> Outcome {
    let agent = match target_agent(peer, agent) {
        Ok(a) => a,
        Err(o) => return o,
    };
    let holder = holder(peer, conn);
    let agent = match agent_id(state, peer, agent).await {
        Ok(a) => a,
        Err(o) => return o,
    };
    // An operator's memory edit changes the agent: in a cluster only its
    // owner may (a turn's child was let in when its turn was).
    if matches!(peer, Peer::Cli)
        && let Err(o) = super::cluster::own(state, &agent, None).await
    {
        return o;
    }
    let taken = tokio::select! {
        t = state.leases.take(&agent, holder, LEASE_WAIT) => t,
        _ = conn.gone.cancelled() => return error(ErrorCode::Unavailable, "the caller went away"),
    };
    if conn.gone.is_cancelled() {
        // Gone while it was granted: nobody is left to give it back.
        state.leases.release(holder);
    }
    match taken {
        Ok(()) => Outcome::reply(&replies::Leased {
            leased: true,
            agent,
        }),
        Err(e) => error(ErrorCode::Unavailable, e.to_string()),
    }
}

/// `memory.release`: give the lease back (a no-op when not held).
pub(crate) fn memory_release(state: &State, peer: &Peer, conn: &Connection) -> Outcome {
    Outcome::reply(&replies::Released {
        released: state.leases.release(holder(peer, conn)),
    })
}

/// The id of the agent a CLI named (leases are keyed by id, not by
/// whichever name or id was typed); a child's own agent as it is.
async fn agent_id(state: &Arc<State>, peer: &Peer, agent: String) -> Result<String, Outcome> {
    match peer {
        Peer::Child { .. } => Ok(agent),
        Peer::Cli => {
            let home = state.home.clone();
            blocking(move || {
                store::find(&home, Some(&agent))
                    .map(|(r, _)| r.id)
                    .map_err(|e| error(ErrorCode::NotFound, e.to_string()))
            })
            .await
        }
    }
}

/// Who a lease of this peer belongs to.
fn holder(peer: &Peer, conn: &Connection) -> Holder {
    match peer {
        Peer::Child { id, .. } => Holder::Child(*id),
        Peer::Cli => Holder::Connection(conn.id),
    }
}

/// `memory.status`: the caller's own checkout. A sub-agent's is the
/// worktree the supervisor launched it on (its child-table entry, never a
/// path it sends); anyone else's is the agent's main checkout.
pub(crate) async fn memory_status(
    state: &Arc<State>,
    peer: &Peer,
    agent: Option<String>,
) -> Outcome {
    let agent = match target_agent(peer, agent) {
        Ok(a) => a,
        Err(o) => return o,
    };
    let worktree = match peer {
        Peer::Child { role, worktree, .. }
            if matches!(role.as_str(), "reflection" | "memory-worker") =>
        {
            match worktree {
                Some(name) => Some(name.clone()),
                None => {
                    return error(
                        ErrorCode::Forbidden,
                        "this sub-agent was launched without a worktree: it has no checkout to report on",
                    );
                }
            }
        }
        _ => None,
    };
    let home = state.home.clone();
    let result = on_agent_thread(
        state,
        &agent.clone(),
        move || -> Result<replies::MemoryStatus, (ErrorCode, String)> {
            let (_, paths) = store::find(&home, Some(&agent))
                .map_err(|e| (ErrorCode::NotFound, e.to_string()))?;
            let repo = match &worktree {
                Some(name) => crate::memfs::worktree::open(&paths, name)
                    .map(|(_, repo)| repo)
                    .map_err(|e| (ErrorCode::Forbidden, e.to_string()))?,
                None => {
                    repo::open_agent(&paths).map_err(|e| (ErrorCode::Internal, e.to_string()))?
                }
            };
            // Never libgit2's status here: it opens the child's files (and
            // `.gitignore`s) by path, where a FIFO blocks this thread for good.
            let status = crate::memfs::status::worktree_status(&repo)
                .map_err(|e| (ErrorCode::Internal, e.to_string()))?;
            Ok(replies::MemoryStatus {
                head: status.head,
                dirty: status.dirty,
                worktree,
            })
        },
    )
    .await;
    match result {
        Ok(Ok(status)) => Outcome::reply(&status),
        Ok(Err((code, e))) => error(code, e),
        Err(e) => error(ErrorCode::Internal, format!("status task failed: {e}")),
    }
}

/// Model calls, made here because only the supervisor holds credentials
/// and network. The request's text deltas stream back as `model.delta`
/// events (tagged with the request id) before the response.
pub async fn model_complete(
    state: &Arc<State>,
    peer: &Peer,
    id: u64,
    request: Value,
    sender: &FrameSender,
) -> Outcome {
    let mut request: ModelRequest = match serde_json::from_value(request) {
        Ok(r) => r,
        Err(e) => {
            return error(
                ErrorCode::InvalidParams,
                format!("invalid model request: {e}"),
            );
        }
    };
    if let Err(refused) = pin_child_model(state, peer, &mut request).await {
        return refused;
    }
    tracing::debug!(?peer, model = %request.model, "model.complete");
    let home = state.home.clone();
    let sender = sender.clone();
    // Deltas also go to subscribers (attach), tagged with the agent.
    let st = state.clone();
    let (who_agent, who_child) = match peer {
        Peer::Child { id, agent, .. } => (Some(agent.clone()), Some(*id)),
        Peer::Cli => (None, None),
    };
    let slot = match peer {
        Peer::Child { agent, .. } => agent.clone(),
        Peer::Cli => "cli".to_string(),
    };
    let role = peer.kind().to_string();
    let call = on_agent_thread(
        state,
        &slot,
        move || -> Result<ModelResponse, ModelError> {
            // The agent's budget, before every call of its turns and
            // sub-agents; the call's upper bound stays reserved until
            // what it spent is recorded.
            let _reservation = match &who_agent {
                Some(agent) => Some(
                    st.accounting
                        .check_budget(&home, agent, &role, "model_call", reservation(&request))
                        .map_err(|r| ModelError::fatal(r.message))?,
                ),
                None => None,
            };
            let began = std::time::Instant::now();
            let answer = call_provider(&home, &request, &st, &who_agent, who_child, &sender, id);
            // Recorded (durably) before the answer goes back to the child.
            let outcome = answer.as_ref().map(|r| &r.usage).map_err(|e| e.to_string());
            st.accounting
                .model_called(
                    who_agent.as_deref(),
                    &role,
                    &request.model,
                    &serde_json::to_value(request.purpose)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    outcome.as_ref().map_err(String::as_str).copied(),
                    began.elapsed().as_millis() as u64,
                )
                .map_err(|e| {
                    ModelError::fatal(format!("the model call could not be recorded: {e}"))
                })?;
            answer
        },
    );
    // A stop does not wait for a provider that hangs: the caller gets an
    // answer now; the abandoned request's thread ends with its timeout.
    let result = tokio::select! {
        r = call => r,
        _ = state.stop.cancelled() => Ok(Err(ModelError::fatal("the supervisor is stopping; the model request was abandoned"))),
    };
    match result {
        Ok(Ok(response)) => Outcome::reply(&response),
        Ok(Err(e)) => Outcome::Error(ErrorBody {
            code: ErrorCode::Unavailable,
            message: e.to_string(),
            data: serde_json::to_value(&e).ok(),
        }),
        Err(e) => error(ErrorCode::Internal, format!("model task failed: {e}")),
    }
}

/// The model a child's request may name: the one recorded when it was
/// launched — a child naming another (a scripted fixture path, a provider
/// the operator did not choose for it) is refused, not obeyed.
async fn pin_child_model(
    state: &Arc<State>,
    peer: &Peer,
    request: &mut ModelRequest,
) -> Result<(), Outcome> {
    if let Peer::Child {
        id, agent, model, ..
    } = peer
    {
        let asked = request.model.trim();
        if !asked.is_empty() && asked != model {
            tracing::warn!(child = id, agent = %agent, asked = ?asked, recorded = %model, "refused a model the child was not launched with");
            super::audit_records::denied(
                state,
                peer,
                "model.complete",
                "a model the child was not launched with",
            )
            .await;
            return Err(error(
                ErrorCode::Forbidden,
                format!(
                    "refused: this child was launched with model {model:?} and cannot ask for another"
                ),
            ));
        }
        request.model = model.clone();
    }
    Ok(())
}

/// Output tokens a call without `max_tokens` is assumed to spend at most
/// (what the Anthropic provider sends when a request names none).
pub const DEFAULT_OUTPUT_RESERVE: u64 = 4096;

/// An upper bound of the tokens `request` can spend: its input is at most
/// one token per byte of the request as encoded (every tokenizer covers at
/// least a byte per token, and the encoding's punctuation stands in for
/// the provider's framing), its output at most `max_tokens`.
pub(crate) fn reservation(request: &crate::protocol::messages::ModelRequest) -> u64 {
    let input = crate::protocol::encoded_len(request) as u64;
    let output = request
        .max_tokens
        .map(u64::from)
        .unwrap_or(DEFAULT_OUTPUT_RESERVE);
    input.saturating_add(output)
}

/// `model.info`: a model's handle and the context window configured for it
/// (`[providers.mock] context_window` for mock handles, else `[model]
/// context_window`; `null` when none is). A child asks about the model
/// recorded at its launch (naming another is refused, as for
/// `model.complete`); a CLI names one (the configured default otherwise).
pub(crate) async fn model_info(state: &Arc<State>, peer: &Peer, asked: Option<String>) -> Outcome {
    let asked = asked
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty());
    let recorded = match peer {
        Peer::Child { model, .. } => {
            if let Some(a) = &asked
                && a != model
            {
                return error(
                    ErrorCode::Forbidden,
                    format!(
                        "refused: this child was launched with model {model:?} and cannot ask about another"
                    ),
                );
            }
            Some(model.clone())
        }
        Peer::Cli => asked,
    };
    let home = state.home.clone();
    let slot = match peer {
        Peer::Child { agent, .. } => agent.clone(),
        Peer::Cli => "cli".to_string(),
    };
    let result = on_agent_thread(state, &slot, move || {
        let cfg = ProviderConfig::load(&home)?;
        let model = recorded.unwrap_or_else(|| crate::model::default_model(&cfg));
        let window = cfg.context_window_for(&model);
        Ok::<_, crate::model::ConfigError>(replies::ModelInfo {
            model,
            context_window: window,
        })
    })
    .await;
    match result {
        Ok(Ok(info)) => Outcome::reply(&info),
        Ok(Err(e)) => error(ErrorCode::Unavailable, e.to_string()),
        Err(e) => error(ErrorCode::Internal, format!("model.info task failed: {e}")),
    }
}

/// A child's log line. Its text is untrusted: it goes into the record as
/// one quoted, escaped field (never as the record's own message), next to
/// the identity the supervisor recorded, so it cannot pass for a record of
/// the supervisor's or of another child.
pub fn log(peer: &Peer, level: LogLevel, message: &str) -> Outcome {
    let (child, agent, role) = match peer {
        Peer::Child {
            id, agent, role, ..
        } => (*id, agent.as_str(), role.as_str()),
        Peer::Cli => (0, "-", "cli"),
    };
    let text = super::untrusted::clip(message);
    match level {
        LogLevel::Error => tracing::error!(child, agent, role, text = ?text, "child log"),
        LogLevel::Warn => tracing::warn!(child, agent, role, text = ?text, "child log"),
        LogLevel::Info => tracing::info!(child, agent, role, text = ?text, "child log"),
        LogLevel::Debug => tracing::debug!(child, agent, role, text = ?text, "child log"),
        LogLevel::Trace => tracing::trace!(child, agent, role, text = ?text, "child log"),
    }
    Outcome::reply(&replies::Ack {})
}

/// `memory.sync`: sync an agent's memory with its remote, under the
/// agent's memory lease (no turn or merge edits the checkout meanwhile).
pub(crate) async fn memory_sync(
    state: &Arc<State>,
    agent: Option<String>,
    remote_root: Option<String>,
    repair: bool,
) -> Outcome {
    let root = remote_root
        .filter(|r| !r.trim().is_empty())
        .or_else(crate::remote::root_from_env);
    let home = state.home.clone();
    let wanted = agent.clone();
    let clone_root = root.clone();
    // An agent this host has never seen, named with a remote configured, is
    // cloned from the remote first (lab 6): the sync after it is then clean.
    let found =
        super::state::blocking(move || find_or_clone(&home, wanted.as_deref(), clone_root)).await;
    let ((record, paths), cloned) = match found {
        Ok(f) => f,
        Err(o) => return o,
    };
    // A sync pushes: in a cluster, only the owner's. A clone is this
    // host's own copy: made, it is answered as is when another host owns
    // the agent (its turns are refused, naming the owner).
    if let Err(o) = super::cluster::own(state, &record.id, None).await {
        return if cloned { cloned_only(&record, o) } else { o };
    }
    let _lease = match state.leases.hold(&record.id, LEASE_WAIT).await {
        Ok(l) => l,
        Err(e) => return error(ErrorCode::Unavailable, e.to_string()),
    };
    let synced = record.clone();
    let repair_root = root.clone();
    let fencing = super::cluster::fencing(state, &record.id);
    let result = on_agent_thread(state, &record.id, move || {
        let out = super::cluster::sync_agent(&paths, &synced, root.as_deref(), &fencing)?;
        let aside = if repair && out.status == crate::memfs::sync::SyncStatus::Conflict {
            crate::memfs::sync::set_aside_for_repair(&paths)?
        } else {
            crate::memfs::sync::Aside::Nothing
        };
        Ok::<_, crate::memfs::sync::SyncError>((out, aside))
    })
    .await;
    // `--repair`: waits for the repair worker (which needs the lease) and
    // checks what it carried over (`sync_repair`).
    let result = match result {
        Ok(Ok((out, aside))) => {
            drop(_lease);
            Ok(Ok(super::sync_repair::finish(
                state,
                &record,
                repair_root,
                out,
                aside,
            )
            .await))
        }
        Ok(Err(e)) => Ok(Err(e)),
        Err(e) => Err(e),
    };
    match result {
        Ok(Ok((mut outcome, aside))) => {
            super::audit_records::synced(state, &record.id, &outcome).await;
            if cloned {
                outcome.message = format!(
                    "cloned agent {} ({}) from the remote; {}",
                    record.name, record.id, outcome.message
                );
            }
            Outcome::reply(&replies::MemorySynced {
                outcome,
                agent: record.id,
                name: record.name,
                cloned,
                repair_branch: aside,
            })
        }
        Ok(Err(e)) => {
            super::audit_records::sync_failed(state, &record.id, &e.to_string()).await;
            error(ErrorCode::Internal, e.to_string())
        }
        Err(e) => error(ErrorCode::Internal, format!("sync task failed: {e}")),
    }
}

/// The agent `wanted` names, or — with a remote root and no such agent
/// here — its clone from the remote (whether it was cloned).
fn find_or_clone(
    home: &crate::paths::Home,
    wanted: Option<&str>,
    clone_root: Option<String>,
) -> Result<
    (
        (crate::store::record::AgentRecord, crate::paths::AgentPaths),
        bool,
    ),
    Outcome,
> {
    let not_found = |e: store::StoreError| error(ErrorCode::NotFound, e.to_string());
    match store::find(home, wanted) {
        Ok(f) => Ok((f, false)),
        Err(store::StoreError::NotFound(sel)) => {
            let Some(root) = clone_root else {
                return Err(not_found(store::StoreError::NotFound(sel)));
            };
            let record = match crate::remote::clone(home, &root, &sel) {
                Ok(r) => r,
                // Another command's clone of it just finished first.
                Err(crate::remote::RemoteError::AlreadyHere(id)) => {
                    return store::find(home, Some(&id))
                        .map(|f| (f, false))
                        .map_err(not_found);
                }
                Err(e) => return Err(error(ErrorCode::NotFound, e.to_string())),
            };
            tracing::info!(agent = %record.id, name = %record.name, "cloned from the remote");
            let paths = home
                .agent(&record.id)
                .map_err(|e| error(ErrorCode::Internal, e.to_string()))?;
            Ok(((record, paths), true))
        }
        Err(e) => Err(not_found(e)),
    }
}

/// The answer to a `memory.sync` that cloned an agent another host owns:
/// the clone stands, nothing was synced (`refused` says why).
fn cloned_only(record: &crate::store::record::AgentRecord, refused: Outcome) -> Outcome {
    let why = match &refused {
        Outcome::Error(e) => e.message.clone(),
        _ => String::new(),
    };
    let message = format!(
        "cloned agent {} ({}) from the remote; not synced: {why}",
        record.name, record.id
    );
    Outcome::reply(&replies::MemorySynced {
        outcome: replies::SyncOutcome::new(replies::SyncStatus::Clean, message),
        agent: record.id.clone(),
        name: record.name.clone(),
        cloned: true,
        repair_branch: None,
    })
}

/// `memory.repair`: an agent child hands its sync conflict to a repair
/// worker — the way out of a `MEMORY GIT CONFLICT` that works from its
/// sandbox, where git cannot run. It is `memory.sync` with `repair` for the
/// child's own agent (from the child table, never the frame) against the
/// supervisor's remote; the memory tool holds no lease meanwhile (the
/// repair worker needs it).
pub(crate) async fn memory_repair(state: &Arc<State>, peer: &Peer) -> Outcome {
    let Peer::Child { agent, .. } = peer else {
        return error(
            ErrorCode::Forbidden,
            super::policy::refusal("cli", "memory.repair"),
        );
    };
    if crate::remote::root_from_env().is_none() {
        return error(
            ErrorCode::Unavailable,
            "no remote is configured for this supervisor (MINI_LETTA_REMOTE_ROOT): there is no sync conflict to repair",
        );
    }
    memory_sync(state, Some(agent.clone()), None, true).await
}
/// One provider call, its text deltas streamed to the caller (and, for a
/// turn's text, to subscribers). On a blocking thread.
fn call_provider(
    home: &crate::paths::Home,
    request: &ModelRequest,
    st: &State,
    who_agent: &Option<String>,
    who_child: Option<u64>,
    sender: &FrameSender,
    id: u64,
) -> Result<ModelResponse, ModelError> {
    let cfg = ProviderConfig::load(home).map_err(ModelError::from)?;
    let model = open_model(&request.model, &cfg)?;
    // A summary (compaction) is not the turn's text: `attach` shows the
    // compaction event instead.
    let turn_text = request.purpose == crate::model::Purpose::Turn;
    model.complete(request, &mut |event| {
        if let ModelEvent::TextDelta { text } = event {
            if turn_text {
                st.emit(Event::TurnDelta(TurnDelta {
                    agent: who_agent.clone(),
                    child: who_child,
                    text: text.clone(),
                }));
            }
            sender.send(&ServerFrame::Event(Event::ModelDelta(ModelDelta {
                request: id,
                text,
            })));
        }
    })
}
