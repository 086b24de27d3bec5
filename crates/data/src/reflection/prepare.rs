//! A sub-agent's launch, prepared on a blocking thread before its child
//! starts: for a reflection the checks of spec memfs-git.md §5.4 in order
//! (settings, the lock, backoff, a clean checkout, a payload), then its
//! worktree and task; for a memory worker its worktree and task. A refusal
//! or failure is the JSON the caller is answered with, and leaves nothing
//! behind.

use serde_json::json;

use super::launch_result::{LaunchResult, Refusal, failed, refused};
use super::outcome::Attempt;
use super::{PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, backoff, lock, payload, prompt, settings};
use crate::clock::now;

use crate::memfs::worktree::{self as wt, Label, MemoryWorktree};
use crate::paths::{AgentPaths, Home};
use crate::protocol::ReflectParams;
use crate::protocol::task::{KIND_MEMORY_WORKER, KIND_REFLECTION, SubagentTask};
use crate::store;
use crate::store::record::AgentRecord;

/// Model responses a reflection or worker may use.
const SUBAGENT_MAX_STEPS: u32 = 12;
/// The tools a reflection or memory worker is offered.
pub const SUBAGENT_TOOLS: &[&str] = &["memory", "Read"];

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

/// Everything prepared for a reflection child before it starts.
pub struct Prepared {
    pub record: AgentRecord,
    pub agent: AgentPaths,
    pub token: String,
    pub manifest: payload::Manifest,
    pub worktree: MemoryWorktree,
    pub task: SubagentTask,
    /// `explicit`: the agent's own integration turn reviews and merges.
    pub mode: settings::MergeMode,
    pub merge_instructions: String,
    pub isolation: Option<String>,
}

/// What of the supervisor a preparation needs: its home, whether children
/// run as the agent's own uid, and the window a sub-agent's requests
/// declare (the supervisor's rule: it reads the model configuration, which
/// this library may not).
pub struct Host<'a> {
    pub home: &'a Home,
    pub uid_switch: bool,
    /// The window for an agent, given the one the caller asked for.
    pub window: &'a dyn Fn(&AgentRecord, Option<u64>) -> Option<u64>,
}

/// The checks and preparation of a reflection, on a blocking thread.
pub fn prepare(
    host: &Host,
    req: &Request,
    mut record: AgentRecord,
    agent: AgentPaths,
) -> Result<Prepared, LaunchResult> {
    let err = |e: &dyn std::fmt::Display| failed(e.to_string());
    let configured = settings::load(&agent).map_err(|e| err(&e))?;
    let mode = match req.mode.as_deref() {
        None => configured.merge,
        Some(m) => m.parse().map_err(|e: super::ReflectionError| err(&e))?,
    };
    // One reflection per agent, across processes (a crashed supervisor's
    // lock is reclaimed by the next acquire).
    let token = match lock::try_acquire_labeled(&agent, std::process::id(), Some("reflection"))
        .map_err(|e| err(&e))?
    {
        lock::Acquire::Acquired { token } => token,
        lock::Acquire::Held { .. } => return Err(refused(Refusal::AlreadyActive)),
    };
    let fail = |v: LaunchResult| {
        let _ = lock::release(&agent, &token);
        v
    };
    if !req.manual
        && let Some(retry_at) = backoff::check(&agent, now()).map_err(|e| fail(err(&e)))?
    {
        return Err(fail(super::launch_result::backoff(retry_at)));
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
    let drop_payload = |v: LaunchResult| {
        let _ = payload::remove_payload(&agent, &manifest.launch_id);
        fail(v)
    };
    let worktree = wt::create(&agent, Label::Reflection).map_err(|e| drop_payload(err(&e)))?;
    let prepared = (|| -> Result<SubagentTask, LaunchResult> {
        // The confined child runs as the agent's uid: the worktree is its.
        if host.uid_switch {
            let uid =
                store::ensure_sandbox_uid(host.home, &mut record, &agent).map_err(|e| err(&e))?;
            crate::sandbox::identity::give_tree(&worktree.dir, uid).map_err(|e| err(&e))?;
        }
        let built =
            prompt::build(&agent, &manifest, &worktree.dir, worktree.base).map_err(|e| err(&e))?;
        save_prompt_cache(host.home, &record, &worktree, &built.system);
        Ok(SubagentTask {
            kind: KIND_REFLECTION.into(),
            system: built.system,
            prompt: built.user,
            memory_dir: worktree.dir.display().to_string(),
            fork_conversation: None,
            context_window: (host.window)(&record, req.context_window),
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
fn save_prompt_cache(home: &Home, record: &AgentRecord, worktree: &MemoryWorktree, system: &str) {
    use std::os::unix::fs::DirBuilderExt;
    let saved = home
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
                "compiledAt": crate::clock::rfc3339(now()),
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

/// Undo a launch that never ran: worktree, payload, lock.
pub fn abandon(p: &Prepared) {
    if let Err(e) = wt::discard(&p.agent, &p.worktree) {
        tracing::warn!(agent = %p.record.id, "cannot remove the reflection worktree: {e}");
    }
    let _ = payload::remove_payload(&p.agent, &p.manifest.launch_id);
    let _ = lock::release(&p.agent, &p.token);
}

/// A memory worker's worktree and task, for `instruction` of agent
/// `agent_id` (`earlier`: its previous runs). On a blocking thread; the
/// worktree goes again when the task cannot be made.
pub fn prepare_worker(
    host: &Host,
    agent_id: &str,
    instruction: &str,
    earlier: &[Attempt],
) -> Result<(AgentRecord, AgentPaths, MemoryWorktree, SubagentTask), LaunchResult> {
    let err = |e: &dyn std::fmt::Display| failed(e.to_string());
    let (mut record, agent) = store::find(host.home, Some(agent_id)).map_err(|e| err(&e))?;
    let worktree = wt::create(&agent, Label::MemoryWorker).map_err(|e| err(&e))?;
    let task = (|| -> Result<SubagentTask, LaunchResult> {
        if host.uid_switch {
            let uid =
                store::ensure_sandbox_uid(host.home, &mut record, &agent).map_err(|e| err(&e))?;
            crate::sandbox::identity::give_tree(&worktree.dir, uid).map_err(|e| err(&e))?;
        }
        let built = prompt::worker(&worktree.dir, instruction, earlier).map_err(|e| err(&e))?;
        Ok(SubagentTask {
            kind: KIND_MEMORY_WORKER.into(),
            system: built.system,
            prompt: built.user,
            memory_dir: worktree.dir.display().to_string(),
            fork_conversation: None,
            context_window: (host.window)(&record, None),
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
}
