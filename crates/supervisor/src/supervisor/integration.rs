//! The explicit mode's integration (spec memfs-git.md §5.5): after a
//! reflection, a turn of the agent's own child reviews the reflection's
//! branch and merges it with `memory.merge` — that branch, from that
//! conversation, nothing else. What counts afterwards is git's ancestry,
//! not what the turn says.

use std::sync::Arc;

use super::launch::SubagentLaunch;
use super::leases::LEASE_WAIT;
use super::state::{PendingIntegration, State, blocking, error};
use super::subagent_child::{off_thread, start_child, stop_child, wait_exit};
use crate::memfs::worktree::{self as wt, MemoryWorktree};
use crate::paths::AgentPaths;
use crate::protocol::events::ChildEnd;
use crate::protocol::{ErrorCode, Outcome, SpawnParams, StdioMode};
use crate::reflection::finalize::{Integrated, integration_failure};
use crate::reflection::prepare::Prepared;
use crate::store;
use crate::store::conversation::lines::{Line, LinePos, LogLines};

/// Longest an integration turn may run.
const INTEGRATION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// Run the agent's integration turn for reflection `p` (a turn of the
/// agent's own child, in conversation `reflection-integration-<id>`, its
/// input from us and its output logged). `None` when there is nothing to
/// integrate (no commits, a dirty worktree: finalize decides those).
pub async fn integrate(state: &Arc<State>, p: &Prepared) -> Option<Integrated> {
    let (agent, worktree) = (p.agent.clone(), p.worktree.clone());
    let proposal = off_thread(move || Ok(proposal_of(&agent, &worktree)))
        .await
        .ok()
        .flatten()?;
    let conversation = format!("reflection-integration-{}", p.worktree.id);
    let summary = format!("integrated reflection {}", p.worktree.id);
    state.subagents.with(&p.record.id, |a| {
        a.integration = Some(PendingIntegration {
            conversation: conversation.clone(),
            worktree: p.worktree.name.clone(),
            branch: p.worktree.branch.clone(),
            summary,
            merge: None,
        })
    });
    let text = crate::reflection::prompt::integration(
        &p.worktree.branch,
        &proposal,
        &p.merge_instructions,
    );
    let ran = run_internal_turn(state, p, &conversation, text).await;
    let merge = state
        .subagents
        .with(&p.record.id, |a| a.integration.take())
        .and_then(|i| i.merge);
    let (exit, failure) = match ran {
        Ok(end @ ChildEnd::Exited { code: 0 }) => (Some(end), None),
        Ok(end) => {
            let exit = serde_json::to_value(end).unwrap_or_default();
            let why = format!("the integration turn ended with {exit}");
            (Some(end), Some(integration_failure(&why)))
        }
        Err(e) => (None, Some(integration_failure(&e))),
    };
    Some(Integrated {
        conversation,
        exit,
        merge,
        failure,
    })
}

/// What the reflection proposes: the patch of its branch against where it
/// started (capped), for the integration turn to review. `None` when the
/// branch has no commits or the worktree holds uncommitted edits.
fn proposal_of(agent: &AgentPaths, worktree: &MemoryWorktree) -> Option<String> {
    let (_, repo) = wt::open(agent, &worktree.name).ok()?;
    let status = crate::memfs::status::worktree_status(&repo).ok()?;
    if !status.dirty.is_empty() {
        return None;
    }
    let tip = repo.head().ok()?.peel_to_commit().ok()?;
    if tip.id() == worktree.base {
        return None;
    }
    let base = repo.find_commit(worktree.base).ok()?.tree().ok()?;
    let diff = repo
        .diff_tree_to_tree(Some(&base), Some(&tip.tree().ok()?), None)
        .ok()?;
    let mut out = String::new();
    let _ = diff.print(git2::DiffFormat::Patch, |_, _, line| {
        if out.len() < 20_000 {
            if matches!(line.origin(), '+' | '-' | ' ') {
                out.push(line.origin());
            }
            out.push_str(&String::from_utf8_lossy(line.content()));
        }
        true
    });
    Some(out)
}

/// Start a turn of the agent's own child in `conversation` with `text` as
/// the user's message (the integration of the explicit mode), and wait for
/// its exit. Its events are logged, not shown.
async fn run_internal_turn(
    state: &Arc<State>,
    p: &Prepared,
    conversation: &str,
    text: String,
) -> Result<ChildEnd, String> {
    use std::io::Write;
    let programs = crate::paths::Programs::installed().map_err(|e| e.to_string())?;
    let (in_r, mut in_w) = std::io::pipe().map_err(|e| e.to_string())?;
    let (out_r, out_w) = std::io::pipe().map_err(|e| e.to_string())?;
    let (err_r, err_w) = std::io::pipe().map_err(|e| e.to_string())?;
    let fds: Vec<std::os::fd::OwnedFd> = vec![in_r.into(), out_w.into(), err_w.into()];
    let spawn = SpawnParams {
        agent: p.record.id.clone(),
        role: "agent".into(),
        argv: vec![
            programs.agent.display().to_string(),
            "turn".into(),
            "--agent-dir".into(),
            p.agent.dir().display().to_string(),
            "--conversation".into(),
            conversation.to_string(),
        ],
        stdio: StdioMode::Passed,
        workspace: None,
        isolation: p.isolation.clone(),
        model: Some(p.record.model.clone()),
    };
    let events = state.events.subscribe();
    let sub = SubagentLaunch {
        conversation: Some(conversation.to_string()),
        ..SubagentLaunch::default()
    };
    let child = start_child(state, spawn, fds, sub).await?;
    let input = crate::protocol::turn::TurnInput {
        text,
        conversation: conversation.to_string(),
        model: None,
        max_steps: Some(8),
        workspace: None,
        recompile: false,
        new_session: true,
        context_window: None,
        context_window_override: p.task.context_window,
        reflection_context_window: None,
        compact: None,
        timings: false,
    };
    let bytes = serde_json::to_vec(&input).map_err(|e| e.to_string())?;
    // The child reads its input and writes its events on threads of their
    // own, so neither pipe can fill and stall the other.
    std::thread::spawn(move || {
        let _ = in_w.write_all(&bytes);
    });
    for (stream, name) in [(out_r, "stdout"), (err_r, "stderr")] {
        std::thread::spawn(move || {
            let lines = LogLines::resuming(
                std::io::BufReader::new(stream),
                LinePos::default(),
                super::untrusted::MAX_LINE,
            );
            // Each line held up to the cap only; the rest are read and dropped.
            for line in lines.take(10_000) {
                match line {
                    Ok(Line::Text { bytes, .. }) => {
                        let line = String::from_utf8_lossy(&bytes);
                        tracing::debug!(child, stream = name, text = ?line, "integration turn");
                    }
                    Ok(Line::TooLong { len, .. }) => {
                        tracing::debug!(
                            child,
                            stream = name,
                            len,
                            "integration turn: a line over the cap"
                        );
                    }
                    Err(_) => break,
                }
            }
        });
    }
    match tokio::time::timeout(INTEGRATION_DEADLINE, wait_exit(state, events, child)).await {
        Ok(end) => Ok(end),
        Err(_) => {
            stop_child(state, child);
            Err(format!("it did not finish within {INTEGRATION_DEADLINE:?}"))
        }
    }
}

/// `memory.merge`, from the agent's integration turn: merge the reflection
/// branch being integrated — that one, from that conversation, nothing
/// else — into main, under the memory lease.
pub(crate) async fn memory_merge(
    state: &Arc<State>,
    peer: &super::state::Peer,
    branch: String,
) -> Outcome {
    let super::state::Peer::Child {
        agent,
        conversation,
        ..
    } = peer
    else {
        return error(
            ErrorCode::Forbidden,
            "memory.merge comes from agent children only",
        );
    };
    let pending = state.subagents.with(agent, |a| a.integration.clone());
    let Some(pending) = pending.filter(|p| Some(&p.conversation) == conversation.as_ref()) else {
        return error(
            ErrorCode::Forbidden,
            "no reflection is being integrated in this conversation: there is nothing to merge",
        );
    };
    if !branch.is_empty() && pending.branch != branch {
        return error(
            ErrorCode::Forbidden,
            format!("only {} may be merged here", pending.branch),
        );
    }
    let lease = match state.leases.hold(agent, LEASE_WAIT).await {
        Ok(l) => l,
        Err(e) => return error(ErrorCode::Unavailable, e.to_string()),
    };
    let (home, id, p2) = (state.home.clone(), agent.clone(), pending.clone());
    let merged = blocking(move || {
        let paths = home
            .agent(&id)
            .map_err(|e| error(ErrorCode::NotFound, e.to_string()))?;
        let (worktree, _) = wt::open(&paths, &p2.worktree)
            .map_err(|e| error(ErrorCode::NotFound, e.to_string()))?;
        let f = store::commit_signature(&paths)
            .map_err(wt::git("make a commit signature"))
            .and_then(|sig| wt::merge_for_integration(&paths, &worktree, &p2.summary, &sig))
            .map_err(|e| error(ErrorCode::Internal, e.to_string()))?;
        Ok(f.reply())
    })
    .await;
    drop(lease);
    match merged {
        Ok(v) => {
            super::audit_records::merged(state, agent, "agent", &v).await;
            state.subagents.with(agent, |a| {
                if let Some(i) = a.integration.as_mut() {
                    i.merge = Some(v.clone());
                }
            });
            Outcome::reply(&v)
        }
        Err(o) => o,
    }
}
