//! The launch of a sub-agent's confined child (a reflection, a memory
//! worker, a recall sub-agent, an integration turn): its spawn parameters,
//! the window its requests declare, its start, waiting for its exit and
//! stopping it past a deadline.

use std::sync::Arc;

use super::children::ChildState;
use super::launch::{SubagentLaunch, spawn_with};
use super::state::State;
use crate::paths::AgentPaths;
use crate::protocol::events::ChildEnd;
use crate::protocol::{Event, Outcome, SpawnParams, StdioMode};
use crate::reflection::launch_result::{LaunchResult, failed};
use crate::reflection::prepare::Host;
use crate::store::record::AgentRecord;

/// Run `f` on a blocking thread; a failure becomes an `error` refusal.
pub(crate) async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, LaunchResult> + Send + 'static,
) -> Result<T, LaunchResult> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(failed(format!("task failed: {e}"))),
    }
}

/// The window a sub-agent's requests declare: the supervisor's own
/// `MINI_LETTA_REFLECTION_CONTEXT_WINDOW`, `config.toml`'s `[reflection]
/// context_window`, the one asked for (the caller's variable, or its main
/// window), the agent's, the one configured for its model — the order
/// `agent::context::window` documents.
pub(crate) fn subagent_window(st: &State, record: &AgentRecord, asked: Option<u64>) -> Option<u64> {
    use crate::agent::context::window::{self, ReflectionWindowSource as S};
    let env = window::env_window(window::REFLECTION_CONTEXT_WINDOW_ENV).unwrap_or_else(|e| {
        tracing::warn!("{e}; ignored");
        None
    });
    let cfg = crate::model::ProviderConfig::load(&st.home).unwrap_or_else(|e| {
        tracing::warn!("{e}; the sub-agent's window ignores it");
        crate::model::ProviderConfig::offline()
    });
    let (w, source) = window::first_window(
        &[
            (env, S::Environment),
            (cfg.reflection_context_window, S::Config),
            (asked, S::Caller),
            (window::agent_window(&record.model_settings), S::Agent),
            (cfg.context_window_for(&record.model), S::Provider),
        ],
        S::None,
    );
    tracing::debug!(agent = %record.id, window = ?w, source = ?source, "sub-agent window");
    w
}

/// How a sub-agent child of `role` is started: the agent-side program's
/// `subagent` entry for the agent's directory, no stdio, the agent's model.
pub(crate) fn subagent_spawn(
    record: &AgentRecord,
    agent: &AgentPaths,
    role: &str,
    isolation: Option<String>,
) -> Result<SpawnParams, String> {
    let programs = crate::paths::Programs::installed().map_err(|e| e.to_string())?;
    Ok(SpawnParams {
        agent: record.id.clone(),
        role: role.into(),
        argv: vec![
            programs.agent.display().to_string(),
            "subagent".into(),
            "--agent-dir".into(),
            agent.dir().display().to_string(),
        ],
        stdio: StdioMode::Null,
        workspace: None,
        isolation,
        model: Some(record.model.clone()),
    })
}

/// Start a sub-agent's child; its id, or why it did not start.
pub(crate) async fn start_child(
    state: &Arc<State>,
    spawn: SpawnParams,
    fds: super::frames_io::PassedFds,
    sub: SubagentLaunch,
) -> Result<u64, String> {
    match spawn_with(state, spawn, fds, sub).await {
        Ok(started) => Ok(started.child),
        Err(Outcome::Error(e)) => Err(e.message),
        Err(other) => Err(format!("the launch answered {other:?}")),
    }
}

/// SIGKILL child `id` and what it started (a sub-agent past its deadline).
pub(crate) fn stop_child(state: &State, id: u64) {
    let info = state.table.lock().ok().and_then(|t| t.get(id).cloned());
    if let Some(info) = info {
        let _ = super::child_signals::kill_child_tree(info.pid);
    }
}

/// How child `id` ended (its `child.exit`, or the table after a lag).
pub async fn wait_exit(
    state: &State,
    mut events: tokio::sync::broadcast::Receiver<Event>,
    id: u64,
) -> ChildEnd {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(Event::ChildExit(exit)) if exit.child == id => return exit.end,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => {
                let info = state.table.lock().ok().and_then(|t| t.get(id).cloned());
                match info.map(|i| i.state) {
                    Some(ChildState::Exited { code }) => return ChildEnd::Exited { code },
                    Some(ChildState::Killed { signal }) => return ChildEnd::Killed { signal },
                    _ => {}
                }
            }
            Err(RecvError::Closed) => return ChildEnd::Killed { signal: 9 },
        }
    }
}

/// `f` given what of the supervisor a sub-agent's preparation needs (see
/// [`Host`]).
pub(crate) fn with_host<T>(st: &State, f: impl FnOnce(&Host) -> T) -> T {
    let window = |record: &AgentRecord, asked| subagent_window(st, record, asked);
    f(&Host {
        home: &st.home,
        uid_switch: st.sandbox.uid_switch.available,
        window: &window,
    })
}
