//! `recall.delegate`: a confined recall sub-agent that forks the caller's
//! conversation, searches what was said, and answers with its findings.

use std::sync::Arc;

use super::launch::{SubagentLaunch, spawn_with};
use super::state::{State, blocking, error};
use super::subagent_child::{stop_child, subagent_spawn, subagent_window, wait_exit};
use super::workers::MAX_WORKER_INSTRUCTION_BYTES;
use crate::protocol::events::ChildEnd;
use crate::protocol::replies;
use crate::protocol::task::SubagentTask;
use crate::protocol::{ErrorCode, Outcome};
use crate::reflection::prompt;
use crate::store;

/// Longest a recall sub-agent may run before it is stopped.
const RECALL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(180);

/// Model responses a recall sub-agent may use.
const RECALL_MAX_STEPS: u32 = 6;

/// The tools a recall sub-agent is offered.
pub(crate) const RECALL_TOOLS: &[&str] = &["recall_search"];

/// `recall.delegate`, from an agent child: a confined recall sub-agent
/// (profile `recall`: read-only messages and index, no memory writes) that
/// starts from the caller's conversation — the one the supervisor started
/// the caller for — searches, and answers with its findings.
pub(crate) async fn recall_delegate(
    state: &Arc<State>,
    peer: &super::state::Peer,
    query: String,
) -> Outcome {
    let (agent, isolation, conversation) = match peer.agent_child("recall.delegate") {
        Ok(c) => c,
        Err(o) => return o,
    };
    let Some(conversation) = conversation.clone() else {
        return error(
            ErrorCode::Forbidden,
            "this child was not started for a conversation: there is nothing to fork",
        );
    };
    let query = query.trim().to_string();
    if query.is_empty() || query.len() > MAX_WORKER_INSTRUCTION_BYTES {
        return error(
            ErrorCode::InvalidParams,
            format!("a recall query is 1 to {MAX_WORKER_INSTRUCTION_BYTES} bytes"),
        );
    }
    let (st, id) = (state.clone(), agent.clone());
    let found = blocking(move || {
        store::find(&st.home, Some(&id)).map_err(|e| error(ErrorCode::NotFound, e.to_string()))
    })
    .await;
    let (record, paths) = match found {
        Ok(f) => f,
        Err(o) => return o,
    };
    let built = prompt::recall(&query);
    let task = SubagentTask {
        kind: crate::protocol::task::KIND_RECALL.into(),
        system: built.system,
        prompt: built.user,
        memory_dir: String::new(),
        fork_conversation: Some(conversation),
        context_window: subagent_window(state, &record, None),
        max_steps: RECALL_MAX_STEPS,
        tools: RECALL_TOOLS.iter().map(|t| t.to_string()).collect(),
    };
    let spawn = match subagent_spawn(&record, &paths, "recall", isolation.clone()) {
        Ok(s) => s,
        Err(e) => return error(ErrorCode::Internal, e),
    };
    let events = state.events.subscribe();
    let sub = SubagentLaunch {
        worktree: None,
        task: Some(task),
        conversation: None,
        timings: false,
        warm: false,
    };
    let child = match spawn_with(state, spawn, Vec::new(), sub).await {
        Ok(started) => started.child,
        Err(o) => return o,
    };
    let end = match tokio::time::timeout(RECALL_DEADLINE, wait_exit(state, events, child)).await {
        Ok(end) => end,
        Err(_) => {
            stop_child(state, child);
            state.tasks.lock().ok().map(|mut t| t.remove(&child));
            return error(
                ErrorCode::Unavailable,
                format!("the recall sub-agent did not finish within {RECALL_DEADLINE:?}"),
            );
        }
    };
    let report = state
        .tasks
        .lock()
        .ok()
        .and_then(|mut t| t.remove(&child))
        .and_then(|e| e.report);
    match (end, report) {
        (ChildEnd::Exited { code: 0 }, Some(findings)) => {
            Outcome::reply(&replies::Findings { child, findings })
        }
        (end, report) => error(
            ErrorCode::Unavailable,
            format!(
                "the recall sub-agent failed ({}): {}",
                serde_json::to_value(end).unwrap_or_default(),
                report.unwrap_or_else(|| "no report".into())
            ),
        ),
    }
}
