//! Sub-agents under the supervisor: the tasks children fetch
//! (`task.get`) and the reports they leave (`task.finish`). Which
//! reflection and memory worker of each agent is running is shared state
//! (`state::Running`).

use super::state::{Peer, State, error};
use crate::protocol::task::clip_report;
use crate::protocol::{ErrorCode, Outcome, replies};

/// `task.get`: the task recorded for the calling child at its launch.
pub(crate) fn task_get(state: &State, peer: &Peer) -> Outcome {
    let Peer::Child { id, .. } = peer else {
        return error(
            ErrorCode::Forbidden,
            "task.get comes from sub-agent children only",
        );
    };
    let tasks = state.tasks.lock().unwrap_or_else(|p| p.into_inner());
    match tasks.get(id) {
        Some(entry) => Outcome::reply(&entry.task),
        None => error(ErrorCode::NotFound, "no task was recorded for this child"),
    }
}

/// `task.finish`: keep the calling child's report (capped) with its task.
pub(crate) fn task_finish(state: &State, peer: &Peer, report: String) -> Outcome {
    let Peer::Child { id, .. } = peer else {
        return error(
            ErrorCode::Forbidden,
            "task.finish comes from sub-agent children only",
        );
    };
    let mut tasks = state.tasks.lock().unwrap_or_else(|p| p.into_inner());
    match tasks.get_mut(id) {
        Some(entry) => {
            // Whatever the child sends, at most the cap is kept.
            entry.report = Some(clip_report(&report));
            Outcome::reply(&replies::Kept { kept: true })
        }
        None => error(ErrorCode::NotFound, "no task was recorded for this child"),
    }
}
