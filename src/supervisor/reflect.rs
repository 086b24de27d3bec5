//! Reflections and memory workers under the supervisor (spec memfs-git.md
//! §4–6): launch checks in the spec's order, a worktree per sub-agent, a
//! confined child with the `reflection` / `memory-worker` profile, and —
//! when it exits — the finalize ladder run here, under the agent's memory
//! lease and the repository lock, with the transcript cursor advanced only
//! on `merged` / `no_changes`.
//!
//! What a sub-agent may touch is fixed here, at launch: its worktree (from
//! which its `memory.commit` lands on its branch) and its task. Its exit,
//! whatever it reports, decides only `should_merge`; what reaches `main`
//! is what git says its branch holds, validated again as merged.

use std::sync::Arc;

use serde_json::{Value, json};
use time::OffsetDateTime;

use super::children::ChildState;
use super::launch::{SubagentLaunch, spawn_with};
use super::leases::LEASE_WAIT;
use super::state::{PendingIntegration, State, blocking, error};
use crate::memfs::worktree::{self as wt, FinalizeOptions, FinalizeStatus, Label, MemoryWorktree};
use crate::paths::AgentPaths;
use crate::protocol::events::ChildEnd;
use crate::protocol::task::{KIND_MEMORY_WORKER, KIND_REFLECTION, SubagentTask};
use crate::protocol::{ErrorCode, Event, Outcome, ReflectParams, SpawnParams, StdioMode};
use crate::reflection::launch_result::{CompletionStatus, LaunchResult, Refusal};
use crate::reflection::outcome::{self, Attempt, MergePart, Next, TaskPart};
use crate::reflection::queue::{self, QueuedWorker};
use crate::reflection::{backoff, lock, payload, prompt, settings, state as rstate, trigger};
use crate::store;
use crate::store::conversation::lines::{Line, LinePos, LogLines};
use crate::store::record::AgentRecord;

/// Model responses a reflection or worker may use.
const SUBAGENT_MAX_STEPS: u32 = 12;
/// The tools a reflection or memory worker is offered.
pub(crate) const SUBAGENT_TOOLS: &[&str] = &["memory", "Read"];
/// The tools a recall sub-agent is offered.
pub(crate) const RECALL_TOOLS: &[&str] = &["recall_search"];

/// Who asked for a reflection.
#[derive(Debug, Clone)]
pub struct Request {
    pub agent: Option<String>,
    pub manual: bool,
    pub instruction: Option<String>,
    pub mode: Option<String>,
    pub context_window: Option<u64>,
    pub isolation: Option<String>,
    /// Why: `manual`, `step-count`, `compaction-event`.
    pub trigger: String,
}

impl Request {
    pub fn manual(p: &ReflectParams) -> Self {
        Request {
            agent: p.agent.clone(),
            manual: true,
            instruction: p.instruction.clone(),
            mode: p.mode.clone(),
            context_window: p.context_window,
            isolation: p.isolation.clone(),
            trigger: "manual".into(),
        }
    }
}

/// A launched reflection: what the caller is told, and how to wait for it.
pub struct Launched {
    pub info: Value,
    pub done: tokio::sync::oneshot::Receiver<Value>,
}

/// `reflect.run`.
pub async fn reflect_run(state: &Arc<State>, params: ReflectParams) -> Outcome {
    let wait = params.wait;
    match launch_reflection(state, Request::manual(&params)).await {
        Ok(launched) => {
            let mut info = launched.info;
            if wait {
                let result = launched.done.await.unwrap_or_else(
                    |_| json!({"status": "failed", "summary": "the supervisor stopped before the reflection was finalized"}),
                );
                if let Some(o) = info.as_object_mut() {
                    o.insert("result".into(), result);
                }
            }
            Outcome::Result(info)
        }
        Err(refusal) => Outcome::Result(refusal),
    }
}

/// A refusal as the caller sees it: `{launched: false, reason, message}`.
fn refused(r: Refusal) -> Value {
    serde_json::to_value(LaunchResult::refused(r)).unwrap_or_default()
}

/// An `error` refusal carrying what went wrong.
fn failed(e: impl std::fmt::Display) -> Value {
    serde_json::to_value(LaunchResult::error(e)).unwrap_or_default()
}

/// Run `f` on a blocking thread; a failure becomes an `error` refusal.
async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Value> + Send + 'static,
) -> Result<T, Value> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(failed(format!("task failed: {e}"))),
    }
}

/// Everything prepared for a reflection child before it starts.
struct Prepared {
    record: AgentRecord,
    agent: AgentPaths,
    token: String,
    manifest: payload::Manifest,
    worktree: MemoryWorktree,
    task: SubagentTask,
    /// `explicit`: the agent's own integration turn reviews and merges.
    mode: settings::MergeMode,
    merge_instructions: String,
    isolation: Option<String>,
}

/// Launch a reflection: the checks of spec §5.4 in order, then the
/// worktree, the payload and the child. Refusals are `Err(json)`.
pub async fn launch_reflection(state: &Arc<State>, req: Request) -> Result<Launched, Value> {
    let home = state.home.clone();
    let selector = req.agent.clone();
    let (record, agent) = off_thread(move || {
        store::find(&home, selector.as_deref()).map_err(|e| failed(e.to_string()))
    })
    .await?;
    // Reserved in memory first: two launches in this process never race to
    // the lock file.
    let reserved = state.subagents.with(&record.id, |a| {
        if a.reflection.is_some() {
            false
        } else {
            a.reflection = Some(0);
            true
        }
    });
    if !reserved {
        return Err(refused(Refusal::AlreadyActive));
    }
    let prepared = {
        let (st, req, record, agent) = (state.clone(), req.clone(), record.clone(), agent.clone());
        off_thread(move || prepare(&st, &req, record, agent)).await
    };
    let prepared = match prepared {
        Ok(p) => p,
        Err(v) => {
            state.subagents.with(&record.id, |a| a.reflection = None);
            return Err(v);
        }
    };
    let (worktree_name, worktree_dir) = (
        prepared.worktree.name.clone(),
        prepared.worktree.dir.clone(),
    );
    let spawn =
        subagent_spawn(&record, &agent, "reflection", req.isolation.clone()).map_err(failed);
    // Subscribed before the launch, so the exit cannot pass unseen.
    let events = state.events.subscribe();
    let started = match spawn {
        Ok(spawn) => {
            let sub = SubagentLaunch {
                worktree: Some((worktree_name.clone(), worktree_dir.clone())),
                task: Some(prepared.task.clone()),
                conversation: None,
            };
            start_child(state, spawn, Vec::new(), sub)
                .await
                .map_err(failed)
        }
        Err(v) => Err(v),
    };
    let child = match started {
        Ok(child) => child,
        Err(v) => {
            // Nothing ran: the worktree and payload go, the lock is freed.
            let p = prepared;
            let _ = off_thread(move || {
                abandon(&p);
                Ok(())
            })
            .await;
            state.subagents.with(&record.id, |a| a.reflection = None);
            return Err(v);
        }
    };
    state
        .subagents
        .with(&record.id, |a| a.reflection = Some(child));
    let info = json!({
        "launched": true,
        "agent": record.id,
        "child": child,
        "trigger": req.trigger,
        "worktree": worktree_dir,
        "branch": prepared.worktree.branch,
        "transcripts": prepared.manifest.transcripts.iter().map(|t| json!({
            "conversation_id": t.conversation_id,
            "end_message_id": t.end_message_id,
        })).collect::<Vec<_>>(),
    });
    let (tx, rx) = tokio::sync::oneshot::channel();
    let st = state.clone();
    // Tracked: an embedded supervisor drains only after it is finalized.
    state.requests.spawn(async move {
        let end = wait_exit(&st, events, child).await;
        let result = finalize_reflection(&st, prepared, child, end).await;
        let _ = tx.send(result);
    });
    Ok(Launched { info, done: rx })
}

/// The window a sub-agent's requests declare: the supervisor's own
/// `MINI_LETTA_REFLECTION_CONTEXT_WINDOW`, `config.toml`'s `[reflection]
/// context_window`, the one asked for (the caller's variable, or its main
/// window), the agent's, the one configured for its model — the order
/// `agent::context::window` documents.
fn subagent_window(st: &State, record: &AgentRecord, asked: Option<u64>) -> Option<u64> {
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

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// The checks and preparation of a reflection, on a blocking thread.
fn prepare(
    st: &State,
    req: &Request,
    mut record: AgentRecord,
    agent: AgentPaths,
) -> Result<Prepared, Value> {
    let err = |e: &dyn std::fmt::Display| failed(e.to_string());
    let configured = settings::load(&agent).map_err(|e| err(&e))?;
    let mode = match req.mode.as_deref() {
        None => configured.merge,
        Some(m) => m
            .parse()
            .map_err(|e: crate::reflection::ReflectionError| err(&e))?,
    };
    // One reflection per agent, across processes (a crashed supervisor's
    // lock is reclaimed by the next acquire).
    let token = match lock::try_acquire_labeled(&agent, std::process::id(), Some("reflection"))
        .map_err(|e| err(&e))?
    {
        lock::Acquire::Acquired { token } => token,
        lock::Acquire::Held { .. } => return Err(refused(Refusal::AlreadyActive)),
    };
    let fail = |v: Value| {
        let _ = lock::release(&agent, &token);
        v
    };
    if !req.manual
        && let Some(retry_at) = backoff::check(&agent, now()).map_err(|e| fail(err(&e)))?
    {
        return Err(fail(
            serde_json::to_value(LaunchResult::backoff(retry_at)).unwrap_or_default(),
        ));
    }
    // Before any payload or worktree exists (spec §5.4 step 5).
    let repo = crate::memfs::repo::open_agent(&agent).map_err(|e| fail(err(&e)))?;
    let status = crate::memfs::status::worktree_status(&repo).map_err(|e| fail(err(&e)))?;
    drop(repo);
    if !status.dirty.is_empty() {
        return Err(fail(refused(Refusal::ParentDirty)));
    }
    let options = payload::SelectOptions {
        user_instruction: req.instruction.clone(),
        ..payload::SelectOptions::default()
    };
    let manifest = payload::select_and_write(&agent, &record.id, &options, now())
        .map_err(|e| fail(err(&e)))?
        .ok_or_else(|| fail(refused(Refusal::NoPayload)))?;
    let drop_payload = |v: Value| {
        let _ = payload::remove_payload(&agent, &manifest.launch_id);
        fail(v)
    };
    let worktree = wt::create(&agent, Label::Reflection).map_err(|e| drop_payload(err(&e)))?;
    let prepared = (|| -> Result<SubagentTask, Value> {
        // The confined child runs as the agent's uid: the worktree is its.
        if st.sandbox.uid_switch.available {
            let uid =
                store::ensure_sandbox_uid(&st.home, &mut record, &agent).map_err(|e| err(&e))?;
            crate::sandbox::identity::give_tree(&worktree.dir, uid).map_err(|e| err(&e))?;
        }
        let built =
            prompt::build(&agent, &manifest, &worktree.dir, worktree.base).map_err(|e| err(&e))?;
        save_prompt_cache(st, &record, &worktree, &built.system);
        Ok(SubagentTask {
            kind: KIND_REFLECTION.into(),
            system: built.system,
            prompt: built.user,
            memory_dir: worktree.dir.display().to_string(),
            fork_conversation: None,
            context_window: subagent_window(st, &record, req.context_window),
            max_steps: SUBAGENT_MAX_STEPS,
            tools: SUBAGENT_TOOLS.iter().map(|t| t.to_string()).collect(),
        })
    })();
    match prepared {
        Ok(task) => Ok(Prepared {
            record,
            agent: agent.clone(),
            token: token.clone(),
            manifest,
            worktree,
            task,
            mode,
            merge_instructions: configured.merge_instructions,
            isolation: req.isolation.clone(),
        }),
        Err(v) => {
            let _ = wt::discard(&agent, &worktree);
            Err(drop_payload(v))
        }
    }
}

/// The system prompt a reflection was given, kept where the book's lab 5
/// looks for it (`agents/<id>~reflection/conversations/reflection-<id>/`).
/// Root's and private (directories 0700, the file 0600), as the agent's
/// own directory is: it holds the agent's memory. Best effort: a failure
/// is logged, the reflection runs.
fn save_prompt_cache(st: &State, record: &AgentRecord, worktree: &MemoryWorktree, system: &str) {
    use std::os::unix::fs::DirBuilderExt;
    let saved = st
        .home
        .reflection_conversation_dir(&record.id, &worktree.id)
        .map_err(|e| e.to_string())
        .and_then(|dir| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(PRIVATE_DIR_MODE)
                .create(&dir)
                .map_err(|e| e.to_string())?;
            let json = json!({
                "content": system,
                "compiledAt": crate::reflection::format_time(now()),
                "memfsRevision": worktree.base.to_string(),
                "branch": worktree.branch,
            });
            let mut bytes = serde_json::to_vec_pretty(&json).map_err(|e| e.to_string())?;
            bytes.push(b'\n');
            crate::fsutil::atomic_write_mode(
                &dir.join(crate::paths::SYSTEM_PROMPT_FILE_NAME),
                &bytes,
                PRIVATE_FILE_MODE,
            )
            .map_err(|e| e.to_string())
        });
    if let Err(e) = saved {
        tracing::warn!(agent = %record.id, "cannot keep the reflection's system prompt: {e}");
    }
}

/// Modes of the supervisor's own files beside an agent's directory.
const PRIVATE_DIR_MODE: u32 = 0o700;
const PRIVATE_FILE_MODE: u32 = 0o600;

/// Make `path` and what it holds private to its owner (directories 0700,
/// files 0600), as an older supervisor did not. Symlinks are neither
/// followed nor changed; a tree deeper than a reflection's directory is
/// (a few levels) is not walked further. Returns how many entries changed.
fn make_private(path: &std::path::Path, depth: usize) -> usize {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let want = if meta.is_dir() {
        PRIVATE_DIR_MODE
    } else if meta.is_file() {
        PRIVATE_FILE_MODE
    } else {
        return 0;
    };
    let mut changed = 0;
    if meta.permissions().mode() & 0o777 != want
        && std::fs::set_permissions(path, std::fs::Permissions::from_mode(want)).is_ok()
    {
        changed += 1;
    }
    if meta.is_dir()
        && depth > 0
        && let Ok(entries) = std::fs::read_dir(path)
    {
        for e in entries.flatten() {
            changed += make_private(&e.path(), depth - 1);
        }
    }
    changed
}

/// At start: what of agent `id` lies beside its directory is private
/// (modes an older supervisor left), and an agent's index of names too.
fn recover_privacy(home: &crate::paths::Home, id: &str) {
    if let Ok(dir) = home.reflection_agent_dir(id) {
        let changed = make_private(&dir, 6);
        if changed > 0 {
            tracing::info!(agent = %id, changed, "made the reflections' directory private");
        }
    }
}

/// A reflections' directory whose agent is gone (deleted by a version that
/// left it) goes too: it holds that agent's memory.
fn remove_orphan_sibling(home: &crate::paths::Home, owner: &str, path: &std::path::Path) {
    let Ok(agent) = home.agent(owner) else { return };
    if std::fs::symlink_metadata(agent.dir()).is_ok() {
        return;
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => {
            tracing::warn!(agent = %owner, "removed the reflections' directory of a deleted agent")
        }
        Err(e) => {
            tracing::warn!(agent = %owner, "cannot remove the reflections' directory of a deleted agent: {e}")
        }
    }
}

/// Undo a launch that never ran: worktree, payload, lock.
fn abandon(p: &Prepared) {
    if let Err(e) = wt::discard(&p.agent, &p.worktree) {
        tracing::warn!(agent = %p.record.id, "cannot remove the reflection worktree: {e}");
    }
    let _ = payload::remove_payload(&p.agent, &p.manifest.launch_id);
    let _ = lock::release(&p.agent, &p.token);
}

/// How a sub-agent child of `role` is started: the agent-side program's
/// `subagent` entry for the agent's directory, no stdio, the agent's model.
fn subagent_spawn(
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
async fn start_child(
    state: &Arc<State>,
    spawn: SpawnParams,
    fds: super::frames_io::PassedFds,
    sub: SubagentLaunch,
) -> Result<u64, String> {
    match spawn_with(state, spawn, fds, sub).await {
        Ok(Outcome::Result(v)) => Ok(v["child"].as_u64().unwrap_or_default()),
        Ok(Outcome::Error(e)) | Err(Outcome::Error(e)) => Err(e.message),
        Err(Outcome::Result(v)) => Err(v.to_string()),
    }
}

/// SIGKILL child `id` and what it started (a sub-agent past its deadline).
fn stop_child(state: &State, id: u64) {
    let info = state.table.lock().ok().and_then(|t| t.get(id).cloned());
    if let Some(info) = info {
        let _ = super::children::kill_child_tree(info.pid);
    }
}

/// How child `id` ended (its `child.exit`, or the table after a lag).
async fn wait_exit(
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

/// The reflection child has exited: finalize its worktree under the
/// agent's memory lease, advance the cursors on success, record the result.
async fn finalize_reflection(state: &Arc<State>, p: Prepared, child: u64, end: ChildEnd) -> Value {
    let agent_id = p.record.id.clone();
    let report = state
        .tasks
        .lock()
        .ok()
        .and_then(|mut t| t.remove(&child))
        .and_then(|e| e.report);
    let completed = matches!(end, ChildEnd::Exited { code: 0 });
    let task = TaskPart::ended(&end, state.is_stopping(), report.clone());
    // Explicit mode: the agent reviews and merges in a turn of its own;
    // what counts afterwards is git's ancestry, not what the turn says.
    let integration = if completed && p.mode == settings::MergeMode::Explicit {
        integrate(state, &p).await
    } else {
        None
    };
    // Merging writes the checkout: no turn edits it meanwhile. Without the
    // lease nothing is merged (the transcript is retried later).
    let lease = state.leases.hold(&agent_id, LEASE_WAIT).await;
    let should_merge = completed && lease.is_ok();
    let agent = p.agent.clone();
    let result = off_thread(move || {
        Ok(finish_reflection(
            p,
            child,
            should_merge,
            (end, task),
            report,
            integration,
        ))
    })
    .await;
    drop(lease);
    state.subagents.with(&agent_id, |a| a.reflection = None);
    let result = result.unwrap_or_else(|v| v);
    super::audit_records::merged(state, &agent_id, "reflection", &result).await;
    // Published once the lock and the reservation are free: whoever reads
    // the result may launch the next reflection at once.
    let saved = result.clone();
    let _ = off_thread(move || {
        if let Err(e) = crate::reflection::launch_result::save_last_result(&agent, &saved) {
            tracing::warn!("cannot record the reflection's result: {e}");
        }
        Ok(())
    })
    .await;
    tracing::info!(agent = %agent_id, child, result = %result, "reflection finalized");
    if result["status"] == json!("merged") {
        super::autosync::sync_after(state, &agent_id, None).await;
    }
    result
}

fn finish_reflection(
    p: Prepared,
    child: u64,
    should_merge: bool,
    (end, task): (ChildEnd, TaskPart),
    report: Option<String>,
    integration: Option<Integrated>,
) -> Value {
    let summary = format!(
        "reflection {} over {} conversation(s)",
        p.worktree.id,
        p.manifest.transcripts.len()
    );
    let opts = match &integration {
        // The integration turn ran: merged only if the branch is now an
        // ancestor of main (checked by finalize), whatever it reported.
        Some(i) => FinalizeOptions {
            should_merge,
            require_already_merged: true,
            failure_summary: i.failure.clone(),
            summary,
            ..FinalizeOptions::default()
        },
        None => FinalizeOptions {
            should_merge,
            summary,
            ..FinalizeOptions::default()
        },
    };
    let finalized = store::commit_signature(&p.agent)
        .map_err(wt::git("make a commit signature"))
        .and_then(|sig| wt::finalize_reflection(&p.agent, &p.worktree, &opts, &sig));
    let mut value = match finalized {
        Ok(f) => {
            let now = now();
            let outcome = match f.status {
                FinalizeStatus::Merged | FinalizeStatus::NoChanges => {
                    payload::finalize_success(&p.agent, &p.manifest, now)
                        .and_then(|()| backoff::clear(&p.agent))
                        .map_err(|e| e.to_string())
                }
                FinalizeStatus::ParentDirty | FinalizeStatus::MergeConflict => {
                    backoff::record_failure(&p.agent, now)
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
                _ => Ok(()),
            };
            if let Err(e) = outcome {
                tracing::warn!(agent = %p.record.id, "reflection bookkeeping failed: {e}");
            }
            let mut v = serde_json::to_value(&f).unwrap_or_else(|_| json!({}));
            let status = v["status"].as_str().unwrap_or("failed").to_string();
            // A failed integration's line is its own summary.
            let integration_summary = integration
                .as_ref()
                .filter(|_| f.status == FinalizeStatus::Failed)
                .map(|_| f.summary.clone());
            let line = CompletionStatus::from_finalize(&status, integration_summary.as_deref())
                .map(|c| crate::reflection::launch_result::completion_line(&c))
                .unwrap_or_else(|| format!("{} Will retry later.", f.summary));
            if let Some(o) = v.as_object_mut() {
                o.insert("message".into(), json!(line));
            }
            v
        }
        Err(e) => json!({
            "status": "failed",
            "summary": format!("the reflection could not be finalized: {e}"),
            "message": "Tried to reflect, but memory updates were not completed cleanly; will retry later.",
        }),
    };
    if let Some(o) = value.as_object_mut() {
        if let Some(i) = &integration {
            o.insert(
                "integration".into(),
                json!({ "conversation": i.conversation, "exit": i.exit, "merge": i.merge }),
            );
        }
        o.insert("child".into(), json!(child));
        o.insert("exit".into(), serde_json::to_value(end).unwrap_or_default());
        o.insert("report".into(), json!(report));
        o.insert(
            "finishedAt".into(),
            json!(crate::reflection::format_time(now())),
        );
    }
    let merge = MergePart::from_finalized(&value);
    outcome::annotate(&mut value, &merge, &task);
    // Released before the result is published: whoever sees the result
    // may launch the next reflection at once.
    let _ = payload::remove_payload(&p.agent, &p.manifest.launch_id);
    let _ = lock::release(&p.agent, &p.token);
    value
}

/// After a turn of `conversation`: evaluate the agent's trigger (spec
/// §5.1) and launch a reflection when it fires. The turn's answer carries
/// what happened (`None`: the trigger did not fire).
pub async fn after_turn(
    state: &Arc<State>,
    agent_id: &str,
    conversation: &str,
    window: Option<u64>,
    isolation: Option<String>,
) -> Option<Value> {
    let (home, id, conv) = (
        state.home.clone(),
        agent_id.to_string(),
        conversation.to_string(),
    );
    let fired = off_thread(move || {
        let agent = home.agent(&id).map_err(|e| failed(e.to_string()))?;
        let settings = settings::load(&agent).unwrap_or_default();
        Ok(trigger::evaluate(&agent, &conv, &settings).ok().flatten())
    })
    .await
    .ok()
    .flatten()?;
    let req = Request {
        agent: Some(agent_id.to_string()),
        manual: false,
        instruction: None,
        mode: None,
        context_window: window,
        isolation,
        trigger: match fired {
            trigger::TriggerReason::StepCount { .. } => "step-count".into(),
            trigger::TriggerReason::CompactionEvent => "compaction-event".into(),
        },
    };
    Some(match launch_reflection(state, req).await {
        Ok(l) => l.info,
        Err(v) => v,
    })
}

/// `reflect.status`: lock, backoff, running child, last result, cursors.
pub async fn reflect_status(state: &Arc<State>, agent: Option<String>) -> Outcome {
    let home = state.home.clone();
    let found = blocking(move || {
        store::find(&home, agent.as_deref()).map_err(|e| error(ErrorCode::NotFound, e.to_string()))
    })
    .await;
    let (record, agent) = match found {
        Ok(f) => f,
        Err(o) => return o,
    };
    let running = state
        .subagents
        .with(&record.id, |a| (a.reflection, a.worker));
    let waiting = state.subagents.with(&record.id, |a| a.queued_workers.len());
    let id = record.id.clone();
    let status = blocking(move || {
        let settings = settings::load(&agent).unwrap_or_default();
        let lock = lock::inspect(&agent).ok().flatten();
        let backoff = backoff::load(&agent).ok().flatten();
        let last = crate::reflection::launch_result::load_last_result(&agent)
            .ok()
            .flatten();
        let mut conversations = Vec::new();
        for conv in crate::store::conversation::list_ids(&agent).unwrap_or_default() {
            let st = rstate::load(&agent, &conv).unwrap_or_default();
            let mut v = serde_json::to_value(&st).unwrap_or_else(|_| json!({}));
            if let Some(o) = v.as_object_mut() {
                o.insert("conversation".into(), json!(conv));
            }
            conversations.push(v);
        }
        // Instructions kept until applied: queued, running, waiting to be
        // tried again after a failed run, or failed too often.
        let items = queue::list(&agent).unwrap_or_default();
        let kept = items.len();
        let failed = items.iter().filter(|i| i.is_failed()).count();
        let failing = items
            .iter()
            .filter(|i| !i.is_failed() && i.attempts >= queue::FAILING_AFTER)
            .count();
        let last_worker = crate::reflection::launch_result::load_last_worker_result(&agent)
            .ok()
            .flatten();
        Ok(json!({
            "agent": id,
            "settings": settings,
            "lock": lock,
            "backoff": backoff,
            "last": last,
            "last_worker": last_worker,
            "conversations": conversations,
            "workers_kept": kept,
            "workers_failing": failing,
            "workers_failed": failed,
            "workers": items.iter().map(worker_row).collect::<Vec<_>>(),
        }))
    })
    .await;
    match status {
        Ok(mut v) => {
            if let Some(o) = v.as_object_mut() {
                // `child: null` while one is being prepared.
                let slot = |c: Option<u64>| match c {
                    Some(0) => json!({ "child": null, "preparing": true }),
                    Some(child) => json!({ "child": child }),
                    None => Value::Null,
                };
                o.insert("running".into(), slot(running.0));
                o.insert("worker".into(), slot(running.1));
                o.insert("workers_waiting".into(), json!(waiting));
            }
            Outcome::Result(v)
        }
        Err(o) => o,
    }
}

/// A kept instruction as `reflect status` shows it: its state, count and
/// last run (what merged and how the task ended), the instruction cut.
fn worker_row(item: &QueuedWorker) -> Value {
    json!({
        "id": item.id,
        "instruction": crate::reflection::truncate_chars(&item.instruction, 300),
        "status": if item.is_failed() { "failed" } else { "pending" },
        "attempts": item.attempts,
        "queuedAt": item.queued_at,
        "conversation": item.conversation,
        "repair": item.repair.is_some(),
        "last": item.history.last(),
    })
}

/// At start: what a crashed supervisor left of each agent's reflections —
/// a stale `reflection.lock` and orphan worktrees — is cleaned up (a
/// memory worker's branch with commits is kept).
///
/// Run before the first connection is accepted (so it never races a new
/// launch), and cheap when nothing was left: two directory probes per agent.
pub fn recover(home: &crate::paths::Home) {
    let Ok(entries) = std::fs::read_dir(home.agents_dir()) else {
        return;
    };
    // The index of names is root's alone (older ones were 0644).
    make_private(&home.agents_index(), 0);
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if let Some(owner) = id.strip_suffix(crate::paths::REFLECTION_SIBLING_SUFFIX) {
            remove_orphan_sibling(home, owner, &entry.path());
            continue;
        }
        let Ok(agent) = home.agent(&id) else { continue };
        recover_privacy(home, &id);
        // First a move of `main` the stopped supervisor left half done (a
        // merge it was making), so the branch it merged reads as merged.
        if wt::advance::interrupted(&agent.memory_git_dir()) {
            let finished = crate::memfs::lock::RepoLock::acquire(&agent.memory_git_dir())
                .map_err(|e| e.to_string())
                .and_then(|_lock| {
                    let repo = crate::memfs::repo::open_agent(&agent).map_err(|e| e.to_string())?;
                    wt::advance::recover(&repo, &agent.memory_dir()).map_err(|e| e.to_string())
                });
            if let Err(e) = finished {
                tracing::warn!(agent = %id, "cannot finish an interrupted move of main: {e}");
            }
        }
        let stale_lock = lock::inspect(&agent)
            .ok()
            .flatten()
            .is_some_and(|l| !l.alive || l.malformed);
        let has_worktrees = std::fs::read_dir(agent.worktrees_dir())
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        if !stale_lock && !has_worktrees {
            continue;
        }
        match wt::cleanup_orphans(&agent, &[]) {
            Ok(removed) if !removed.is_empty() => {
                tracing::warn!(agent = %id, ?removed, "removed worktrees a stopped supervisor left")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(agent = %id, "cannot clean up old worktrees: {e}"),
        }
        if stale_lock {
            // Acquiring reclaims a stale lock; releasing leaves it free.
            if let Ok(lock::Acquire::Acquired { token }) =
                lock::try_acquire(&agent, std::process::id())
            {
                let _ = lock::release(&agent, &token);
                tracing::warn!(agent = %id, "reclaimed a stale reflection lock");
            }
        }
        let _ = payload::remove_all(&agent);
    }
}

/// Longest instruction a memory worker is given.
const MAX_WORKER_INSTRUCTION_BYTES: usize = 16 * 1024;

/// `worker.start`, from an agent child: a memory worker for the caller's
/// own agent (from the child table) with a self-contained instruction.
/// Workers of one agent run one at a time; a second waits its turn.
pub async fn worker_start(
    state: &Arc<State>,
    peer: &super::state::Peer,
    instruction: String,
) -> Outcome {
    let super::state::Peer::Child {
        agent,
        isolation,
        conversation,
        ..
    } = peer
    else {
        return error(
            ErrorCode::Forbidden,
            "worker.start comes from agent children only",
        );
    };
    let instruction = instruction.trim().to_string();
    if instruction.is_empty() {
        return error(
            ErrorCode::InvalidParams,
            "a memory worker needs an instruction",
        );
    }
    if instruction.len() > MAX_WORKER_INSTRUCTION_BYTES {
        return error(
            ErrorCode::InvalidParams,
            format!(
                "a memory worker's instruction is at most {MAX_WORKER_INSTRUCTION_BYTES} bytes"
            ),
        );
    }
    // Kept on disk before it is acknowledged: a supervisor that stops or
    // crashes leaves it to the next one, never drops it.
    // The conversation is the one the child was started for (the child
    // table's), told if the instruction ends up failing.
    let (home, id, iso, conv) = (
        state.home.clone(),
        agent.clone(),
        isolation.clone(),
        conversation.clone(),
    );
    let kept = blocking(move || {
        let paths = home
            .agent(&id)
            .map_err(|e| error(ErrorCode::NotFound, e.to_string()))?;
        queue::push_for(&paths, &instruction, iso.as_deref(), conv.as_deref(), now())
            .map_err(|e| error(ErrorCode::Unavailable, e.to_string()))
    })
    .await;
    let item = match kept {
        Ok(item) => item,
        Err(o) => return o,
    };
    let queued = state.subagents.with(agent, |a| {
        if a.worker.is_some() {
            a.queued_workers.push_back(item.clone());
            Some(a.queued_workers.len())
        } else {
            a.worker = Some(0);
            None
        }
    });
    if let Some(position) = queued {
        return Outcome::Result(json!({ "launched": false, "queued": true, "position": position }));
    }
    // The caller hears how this launch went: a failure is its answer, not
    // something to try again behind its back.
    Outcome::Result(run_worker_chain(state.clone(), agent.clone(), item, false).await)
}

/// At start: run the memory workers a stopped supervisor acknowledged but
/// did not finish (`reflections/worker-queue.json`), one agent's at a time.
pub fn resume_workers(state: &Arc<State>) {
    let Ok(entries) = std::fs::read_dir(state.home.agents_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Ok(agent) = state.home.agent(&id) else {
            continue;
        };
        if !agent
            .reflections_dir()
            .join(crate::paths::WORKER_QUEUE_FILE_NAME)
            .exists()
        {
            continue;
        }
        // Those marked failed wait for the agent to delegate them again.
        let items = match queue::pending(&agent) {
            Ok(items) => items,
            Err(e) => {
                tracing::warn!(agent = %id, "cannot read the memory workers left to run: {e}");
                continue;
            }
        };
        let mut items = std::collections::VecDeque::from(items);
        let Some(first) = items.pop_front() else {
            continue;
        };
        tracing::info!(agent = %id, waiting = items.len() + 1, "resuming memory workers a stopped supervisor left");
        state.subagents.with(&id, |a| {
            a.worker = Some(0);
            a.queued_workers = items;
        });
        let st = state.clone();
        state.requests.spawn(async move {
            let _ = Box::pin(run_worker_chain(st, id, first, true)).await;
        });
    }
}

/// Forget a finished instruction.
async fn forget_instruction(state: &Arc<State>, agent_id: &str, id: &str) {
    let (home, agent_id, id) = (state.home.clone(), agent_id.to_string(), id.to_string());
    let _ = off_thread(move || {
        if let Ok(paths) = home.agent(&agent_id)
            && let Err(e) = queue::remove(&paths, &id)
        {
            tracing::warn!(agent = %agent_id, "cannot update the memory-worker queue: {e}");
        }
        Ok(())
    })
    .await;
}

/// Launch a worker; when it is finalized, launch the next queued one.
/// `acknowledged`: the instruction was acknowledged as queued (or by a
/// previous supervisor) before this launch, so nobody hears its failure:
/// it is tried again. Otherwise the caller is answered with the failure and
/// the instruction is forgotten.
async fn run_worker_chain(
    state: Arc<State>,
    agent_id: String,
    item: QueuedWorker,
    acknowledged: bool,
) -> Value {
    let first = launch_worker(&state, &agent_id, &item).await;
    if first["launched"] != json!(true) {
        // A stopping supervisor keeps it for the next one; an acknowledged
        // instruction whose launch failed (a full or read-only disk, say)
        // is tried again, later.
        if !state.is_stopping() {
            tracing::warn!(agent = %agent_id, item = %item.id, instruction = %log_excerpt(&item.instruction), result = %first, "a memory worker could not start");
            if acknowledged {
                let why = first["message"]
                    .as_str()
                    .unwrap_or("the worker could not start");
                let task = TaskPart::not_started(why);
                let attempt = Attempt::new(item.next_run(), finished_at(), None, task);
                let settled = settle_off_thread(&state, &agent_id, &item, attempt).await;
                follow_up(&state, &agent_id, &item, Next::Retry, &settled).await;
            } else {
                forget_instruction(&state, &agent_id, &item.id).await;
            }
        }
        next_worker(state, agent_id);
    }
    first
}

fn finished_at() -> String {
    crate::reflection::format_time(now())
}

/// [`outcome::settle`] of a run that did not start (on a blocking thread).
async fn settle_off_thread(
    state: &Arc<State>,
    agent_id: &str,
    item: &QueuedWorker,
    attempt: Attempt,
) -> queue::Settled {
    let (home, id, it) = (state.home.clone(), agent_id.to_string(), item.clone());
    let settled = off_thread(move || {
        let paths = home.agent(&id).map_err(failed)?;
        Ok(queue::settle(&paths, &it, attempt, Next::Retry))
    })
    .await;
    settled.unwrap_or_else(|v| queue::Settled::Unrecorded {
        attempts: item.attempts.saturating_add(1),
        error: v.to_string(),
    })
}

/// The start of an instruction, for a log line (a repair's carries a patch).
fn log_excerpt(instruction: &str) -> String {
    const MAX: usize = 300;
    let mut s: String = instruction.chars().take(MAX).collect();
    if instruction.chars().nth(MAX).is_some() {
        s.push('…');
    }
    s
}

/// Pause before the first re-run of a failed instruction; it doubles with
/// each failure, up to [`WORKER_RETRY_MAX_DELAY`].
const WORKER_RETRY_DELAY: std::time::Duration = std::time::Duration::from_secs(2);
const WORKER_RETRY_MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(120);

/// The pause before run `n + 1` of an instruction whose `n` runs failed.
fn retry_delay(n: u32) -> std::time::Duration {
    WORKER_RETRY_DELAY
        .saturating_mul(1 << n.saturating_sub(1).min(16))
        .min(WORKER_RETRY_MAX_DELAY)
}

/// After a run of `item` that did not finish it (`next` is
/// [`Next::Retry`]), settled as `settled`: run it again after a pause that
/// grows with its failures — or, once it has failed
/// [`queue::MAX_ATTEMPTS`] times, leave it kept, marked failed, for the
/// agent (reminded by the settling) to delegate again. An acknowledged
/// instruction is never dropped: one whose failure cannot be recorded (the
/// disk is full) is counted here and run again all the same, and past the
/// limit left, still pending on disk, for the next supervisor.
async fn follow_up(
    state: &Arc<State>,
    agent_id: &str,
    item: &QueuedWorker,
    next: Next,
    settled: &queue::Settled,
) {
    if next != Next::Retry {
        return;
    }
    let (again, n) = match settled {
        queue::Settled::Gone => return,
        queue::Settled::Kept(k) if k.is_failed() => {
            tracing::error!(agent = %agent_id, item = %k.id, attempts = k.attempts, instruction = %log_excerpt(&k.instruction), "a memory worker failed too often: its instruction is kept, marked failed, and the agent is reminded");
            return;
        }
        queue::Settled::Kept(k) => ((**k).clone(), k.attempts),
        queue::Settled::Unrecorded { attempts, error } => {
            tracing::warn!(agent = %agent_id, item = %item.id, "cannot record a failed memory worker run ({error}); it is tried again");
            if *attempts >= queue::MAX_ATTEMPTS {
                tracing::error!(agent = %agent_id, item = %item.id, "a memory worker failed too often and its queue cannot be written: the instruction is left for the next supervisor");
                return;
            }
            let mut again = item.clone();
            again.attempts = *attempts;
            (again, *attempts)
        }
    };
    if n == queue::FAILING_AFTER {
        tracing::error!(agent = %agent_id, item = %item.id, attempts = n, instruction = %log_excerpt(&item.instruction), "a memory worker keeps failing; its instruction stays queued and is tried again");
    }
    if state.drain.is_cancelled() {
        // Its command is done: the instruction waits in the durable queue
        // for the next supervisor rather than holding this one's end.
        tracing::info!(agent = %agent_id, item = %item.id, "a failed memory worker is left for the next supervisor");
        return;
    }
    let (st, id) = (state.clone(), agent_id.to_string());
    state.requests.spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(retry_delay(n)) => {}
            // Stopping or draining: the next supervisor runs it.
            _ = st.stop.cancelled() => return,
            _ = st.drain.cancelled() => return,
        }
        let idle = st.subagents.with(&id, |a| {
            a.queued_workers.push_back(again);
            a.worker.is_none()
        });
        if idle {
            next_worker(st, id);
        }
    });
}

/// The slot is free: start the next queued worker, if any.
fn next_worker(state: Arc<State>, agent_id: String) {
    let next = state.subagents.with(&agent_id, |a| {
        let next = a.queued_workers.pop_front();
        a.worker = next.as_ref().map(|_| 0);
        next
    });
    if let Some(item) = next {
        let st = state.clone();
        state.requests.spawn(async move {
            let _ = Box::pin(run_worker_chain(st, agent_id, item, true)).await;
        });
    }
}

/// A launched worker, as its finalization needs it.
struct WorkerRun {
    agent: AgentPaths,
    worktree: MemoryWorktree,
    item: QueuedWorker,
    child: u64,
}

async fn launch_worker(state: &Arc<State>, agent_id: &str, item: &QueuedWorker) -> Value {
    let (instruction, isolation) = (item.instruction.clone(), item.isolation.clone());
    let earlier = item.history.clone();
    let (st, id) = (state.clone(), agent_id.to_string());
    let prepared = off_thread(move || {
        let err = |e: &dyn std::fmt::Display| failed(e.to_string());
        let (mut record, agent) = store::find(&st.home, Some(&id)).map_err(|e| err(&e))?;
        let worktree = wt::create(&agent, Label::MemoryWorker).map_err(|e| err(&e))?;
        let task = (|| -> Result<SubagentTask, Value> {
            if st.sandbox.uid_switch.available {
                let uid = store::ensure_sandbox_uid(&st.home, &mut record, &agent)
                    .map_err(|e| err(&e))?;
                crate::sandbox::identity::give_tree(&worktree.dir, uid).map_err(|e| err(&e))?;
            }
            let built =
                prompt::worker(&worktree.dir, &instruction, &earlier).map_err(|e| err(&e))?;
            Ok(SubagentTask {
                kind: KIND_MEMORY_WORKER.into(),
                system: built.system,
                prompt: built.user,
                memory_dir: worktree.dir.display().to_string(),
                fork_conversation: None,
                context_window: subagent_window(&st, &record, None),
                max_steps: SUBAGENT_MAX_STEPS,
                tools: SUBAGENT_TOOLS.iter().map(|t| t.to_string()).collect(),
            })
        })();
        match task {
            Ok(task) => Ok((record, agent, worktree, task)),
            Err(v) => {
                let _ = wt::discard(&agent, &worktree);
                Err(v)
            }
        }
    })
    .await;
    let (record, agent, worktree, task) = match prepared {
        Ok(p) => p,
        Err(v) => return v,
    };
    let spawn = match subagent_spawn(&record, &agent, "memory-worker", isolation) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let events = state.events.subscribe();
    let sub = SubagentLaunch {
        worktree: Some((worktree.name.clone(), worktree.dir.clone())),
        task: Some(task),
        conversation: None,
    };
    let child = match start_child(state, spawn, Vec::new(), sub).await {
        Ok(child) => child,
        Err(e) => {
            let (a, w) = (agent.clone(), worktree.clone());
            let _ = off_thread(move || Ok(wt::discard(&a, &w).map_err(|e| e.to_string()))).await;
            return failed(e);
        }
    };
    state.subagents.with(&record.id, |a| a.worker = Some(child));
    let info = json!({
        "launched": true,
        "agent": record.id,
        "child": child,
        "worktree": worktree.dir,
        "branch": worktree.branch,
    });
    let run = WorkerRun {
        agent,
        worktree,
        item: item.clone(),
        child,
    };
    let st = state.clone();
    state.requests.spawn(async move {
        let end = wait_exit(&st, events, run.child).await;
        finish_worker(st, record.id, run, end).await;
    });
    info
}

/// A worker has exited: merge what it committed (even when it crashed or
/// was stopped with its supervisor — without the lease nothing is), then
/// settle its instruction on both parts of the outcome, and start the next.
async fn finish_worker(st: Arc<State>, id: String, run: WorkerRun, end: ChildEnd) {
    let child = run.child;
    let report = st
        .tasks
        .lock()
        .ok()
        .and_then(|mut t| t.remove(&child))
        .and_then(|e| e.report);
    let task = TaskPart::ended(&end, st.is_stopping(), report);
    let lease = st.leases.hold(&id, LEASE_WAIT).await;
    let cancelled = lease.is_err();
    let (item, isolation, previous) = (
        run.item.clone(),
        run.item.isolation.clone(),
        run.item.repair.clone(),
    );
    let settled = off_thread(move || Ok(integrate_and_settle(&run, end, task, cancelled))).await;
    drop(lease);
    let Ok(s) = settled else {
        next_worker(st, id);
        return;
    };
    super::audit_records::merged(&st, &id, "memory-worker", &s.record).await;
    tracing::info!(agent = %id, child, item = %item.id, instruction = %log_excerpt(&item.instruction), result = %s.record, "memory worker finalized");
    if s.record["status"] == json!("merged") {
        super::autosync::sync_after(&st, &id, None).await;
    }
    if s.conflicted && !st.is_stopping() {
        queue_repair(&st, &id, &s.branch, isolation, previous).await;
    }
    follow_up(&st, &id, &item, s.next, &s.settled).await;
    next_worker(st, id);
}

/// What [`integrate_and_settle`] did.
struct Settlement {
    /// `reflections/last-worker.json`.
    record: Value,
    next: Next,
    settled: queue::Settled,
    /// Its branch was kept after a conflict: a repair is due.
    conflicted: bool,
    branch: String,
}

/// Merge a worker's branch, decide from both parts of the outcome, settle
/// its instruction and record the result. On a blocking thread.
fn integrate_and_settle(
    run: &WorkerRun,
    end: ChildEnd,
    task: TaskPart,
    cancelled: bool,
) -> Settlement {
    let (a, w) = (&run.agent, &run.worktree);
    let integrated = store::commit_signature(a)
        .map_err(wt::git("make a commit signature"))
        .and_then(|sig| wt::integrate_worker(a, w, cancelled, &sig));
    let (mut record, status, checkout_dirty) = match integrated {
        Ok(f) => {
            if let Some(r) = &run.item.repair {
                // The repair's own commits carry the kept change now: the
                // kept branch goes (only if nobody moved it meanwhile).
                if f.status == wt::FinalizeStatus::Merged {
                    let _ = wt::drop_kept_branch(a, &r.branch, &r.tip);
                    for (branch, tip) in &r.also {
                        let _ = wt::drop_kept_branch(a, branch, tip);
                    }
                }
                let _ = crate::reflection::repair::complete(a, &r.signature);
            }
            // Met only uncommitted edits in the checkout: the instruction
            // runs again and redoes the change, so this attempt's branch
            // goes rather than lingering unrepaired.
            let checkout_dirty = f.status == wt::FinalizeStatus::MergeConflict && f.checkout_dirty;
            if checkout_dirty && let Some(tip) = &f.kept_tip {
                let _ = wt::drop_kept_branch(a, &f.branch, tip);
            }
            let v = serde_json::to_value(&f).unwrap_or_else(|_| json!({}));
            (v, f.status, checkout_dirty)
        }
        Err(e) => (
            json!({
                "status": "failed",
                "summary": format!("the worker's worktree could not be finalized: {e}"),
                "branch": w.branch,
            }),
            wt::FinalizeStatus::Failed,
            false,
        ),
    };
    let at = finished_at();
    if let Some(o) = record.as_object_mut() {
        o.insert("child".into(), json!(run.child));
        o.insert("exit".into(), serde_json::to_value(end).unwrap_or_default());
        o.insert("report".into(), json!(task.report));
        o.insert("finishedAt".into(), json!(at));
    }
    let merge = MergePart::from_finalized(&record);
    let next = outcome::next(&merge.status, checkout_dirty, task.status);
    let attempt = Attempt::new(run.item.next_run(), at, Some(merge.clone()), task.clone());
    let settled = queue::settle(a, &run.item, attempt.clone(), next);
    outcome::annotate(&mut record, &merge, &task);
    queue::describe(&mut record, &run.item, &attempt, next, &settled);
    if let Err(e) = crate::reflection::launch_result::save_last_worker_result(a, &record) {
        tracing::warn!("cannot record the memory worker's result: {e}");
    }
    Settlement {
        record,
        next,
        settled,
        conflicted: status == wt::FinalizeStatus::MergeConflict && !checkout_dirty,
        branch: w.branch.clone(),
    }
}

/// `sync --repair`: local commits were set aside on `branch` after a sync
/// conflict; queue the repair worker that re-applies them onto the memory
/// as it now is (the remote's), and start it when no worker runs. The
/// repair's signature in `reflection::repair` when one was queued.
pub async fn repair_set_aside(state: &Arc<State>, agent_id: &str, branch: &str) -> Option<String> {
    let queued = queue_repair(state, agent_id, branch, None, None).await;
    let idle = state.subagents.with(agent_id, |a| {
        a.worker.is_none() && !a.queued_workers.is_empty()
    });
    if idle {
        next_worker(state.clone(), agent_id.to_string());
    }
    queued
}

/// A worker's merge conflicted and its branch was kept: queue a repair
/// worker (chapter 17, exercise 3) that re-applies the kept change to the
/// memory as it is now — once per conflict (`reflection::repair`). Its
/// signature when it was queued.
async fn queue_repair(
    state: &Arc<State>,
    agent_id: &str,
    branch: &str,
    isolation: Option<String>,
    previous: Option<queue::RepairOf>,
) -> Option<String> {
    // A repair that conflicted in turn is repaired again (the memory moved
    // on), a few times at most.
    let depth = previous.as_ref().map_or(0, |p| p.depth + 1);
    if depth >= queue::MAX_REPAIR_DEPTH {
        tracing::warn!(agent = %agent_id, branch, "repairs keep conflicting: the branch stays for an operator");
        return None;
    }
    let mut also = previous
        .map(|p| {
            let mut v = p.also;
            v.push((p.branch, p.tip));
            v
        })
        .unwrap_or_default();
    let (home, id, branch) = (state.home.clone(), agent_id.to_string(), branch.to_string());
    let queued = off_thread(move || {
        let paths = home.agent(&id).map_err(failed)?;
        let Some(change) = wt::kept_change(&paths, &branch).map_err(failed)? else {
            return Ok(None);
        };
        let signature = format!("{}:{}", change.tip, change.main);
        match crate::reflection::repair::claim(&paths, &signature, &branch, now())
            .map_err(failed)?
        {
            crate::reflection::repair::Claim::Attempted => return Ok(None),
            crate::reflection::repair::Claim::Claimed => {}
        }
        let instruction = prompt::repair(&change.branch, &change.patch, &change.added);
        let repair = queue::RepairOf {
            branch: change.branch,
            tip: change.tip,
            signature,
            also: std::mem::take(&mut also),
            depth,
        };
        queue::push_repair(&paths, &instruction, isolation.as_deref(), repair, now())
            .map(Some)
            .map_err(failed)
    })
    .await;
    match queued {
        Ok(Some(item)) => {
            tracing::info!(agent = %agent_id, branch = ?item.repair.as_ref().map(|r| &r.branch), "queued a repair of a conflicted memory worker");
            let signature = item.repair.as_ref().map(|r| r.signature.clone());
            state
                .subagents
                .with(agent_id, |a| a.queued_workers.push_back(item));
            signature
        }
        Ok(None) => None,
        Err(v) => {
            tracing::warn!(agent = %agent_id, result = %v, "cannot queue a repair");
            None
        }
    }
}

/// Longest a recall sub-agent may run before it is stopped.
const RECALL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(180);
/// Model responses a recall sub-agent may use.
const RECALL_MAX_STEPS: u32 = 6;

/// `recall.delegate`, from an agent child: a confined recall sub-agent
/// (profile `recall`: read-only messages and index, no memory writes) that
/// starts from the caller's conversation — the one the supervisor started
/// the caller for — searches, and answers with its findings.
pub async fn recall_delegate(
    state: &Arc<State>,
    peer: &super::state::Peer,
    query: String,
) -> Outcome {
    let super::state::Peer::Child {
        agent,
        isolation,
        conversation,
        ..
    } = peer
    else {
        return error(
            ErrorCode::Forbidden,
            "recall.delegate comes from agent children only",
        );
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
    };
    let child = match spawn_with(state, spawn, Vec::new(), sub).await {
        Ok(Outcome::Result(v)) => v["child"].as_u64().unwrap_or_default(),
        Ok(o @ Outcome::Error(_)) | Err(o) => return o,
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
            Outcome::Result(json!({ "child": child, "findings": findings }))
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

/// The agent's integration turn in the explicit mode, as it ended.
#[derive(Debug, Clone)]
struct Integrated {
    conversation: String,
    exit: Value,
    /// What its `memory.merge` answered, if it merged.
    merge: Option<Value>,
    /// Why the integration did not complete (spec §5.5), when it did not.
    failure: Option<String>,
}

/// Longest an integration turn may run.
const INTEGRATION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// Run the agent's integration turn for reflection `p` (a turn of the
/// agent's own child, in conversation `reflection-integration-<id>`, its
/// input from us and its output logged). `None` when there is nothing to
/// integrate (no commits, a dirty worktree: finalize decides those).
async fn integrate(state: &Arc<State>, p: &Prepared) -> Option<Integrated> {
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
        Ok(ChildEnd::Exited { code: 0 }) => (json!({"state": "exited", "code": 0}), None),
        Ok(end) => {
            let exit = serde_json::to_value(end).unwrap_or_default();
            let why = format!("the integration turn ended with {exit}");
            (exit, Some(integration_failure(&why)))
        }
        Err(e) => (Value::Null, Some(integration_failure(&e))),
    };
    Some(Integrated {
        conversation,
        exit,
        merge,
        failure,
    })
}

fn integration_failure(why: &str) -> String {
    format!(
        "Reflection integration did not complete ({why}); the worktree was cleaned up so the transcript can be retried."
    )
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
pub async fn memory_merge(
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
        serde_json::to_value(&f).map_err(|e| error(ErrorCode::Internal, e.to_string()))
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
            Outcome::Result(v)
        }
        Err(o) => o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_instructions_wait_longer_each_time() {
        let secs: Vec<u64> = (1..=9).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(secs, vec![2, 4, 8, 16, 32, 64, 120, 120, 120]);
        // The runs before an instruction is marked failed span minutes.
        let total: u64 = (1..queue::MAX_ATTEMPTS)
            .map(|n| retry_delay(n).as_secs())
            .sum();
        assert!((120..=600).contains(&total), "{total}");
        // However many failures: still a finite pause.
        assert_eq!(retry_delay(u32::MAX), WORKER_RETRY_MAX_DELAY);
        assert_eq!(retry_delay(0), WORKER_RETRY_DELAY);
        assert_eq!(log_excerpt("短"), "短");
        assert_eq!(log_excerpt(&"x".repeat(301)).chars().count(), 301);
    }
}
