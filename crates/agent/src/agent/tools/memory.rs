//! `memory`: edit the memory files and commit the change through the
//! supervisor (which validates it; its refusal is the tool's error).

use std::path::Path;

use serde_json::{Value, json};

use super::kit::{Args, Tool, ToolContext, ToolOutput, string};
use crate::memfs::commit::CommitOutcome;
use crate::memfs::ops::{OpError, Writer};
use crate::memfs::repo;
use crate::protocol::client::ClientError;
use crate::protocol::messages::ToolSpec;
use crate::protocol::{Call, replies};

pub(super) const TOOL: Tool = Tool {
    name: "memory",
    spec,
    run,
};

/// The commands of the tool, as its schema lists them. Reminders and
/// prompts that tell the agent to run one name it from here.
pub const COMMANDS: &[&str] = &[
    "create",
    "str_replace",
    "insert",
    "delete",
    "rename",
    "update_description",
    "commit",
    "delegate",
    "merge",
    REPAIR_CONFLICT,
];

/// Commit edits already in the memory directory (made with Bash, Write or
/// Edit): the named `file_paths`, else every uncommitted change.
pub const COMMIT: &str = "commit";

/// The supervisor method a command ends in: what decides which roles may
/// run it (`supervisor::policy`). The edits and `commit` are commits.
pub fn method(command: &str) -> &'static str {
    match command {
        "delegate" => "worker.start",
        "merge" => "memory.merge",
        REPAIR_CONFLICT => "memory.repair",
        _ => "memory.commit",
    }
}

/// Hand a sync conflict to a repair worker (the agent's own way out of a
/// `MEMORY GIT CONFLICT`: git cannot run in its sandbox).
pub const REPAIR_CONFLICT: &str = "repair_conflict";

fn spec() -> ToolSpec {
    ToolSpec {
        name: TOOL.name.into(),
        // Every request carries this: kept as short as the 900-token
        // windows of the book's lab 4 need.
        description: "Edit and commit your memory files (Markdown, paths relative to the memory \
            directory). An empty new_string deletes each line containing old_string; delegate gives \
            a self-contained instruction to a background worker."
            .into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "enum": COMMANDS},
                "reason": {"type": "string", "description": "The commit message."},
                "file_path": {"type": "string"},
                "file_paths": {"type": "array"},
                "old_path": {"type": "string"},
                "new_path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "insert_line": {"type": "integer", "minimum": 1},
                "insert_text": {"type": "string"},
                "description": {"type": "string"},
                "file_text": {"type": "string"},
                "instruction": {"type": "string"}
            },
            "required": ["command", "reason"]
        }),
    }
}

/// A writer whose commits go through the supervisor; the call's `reason`
/// is the body of each commit message (the subject names the operation).
fn writer(ctx: &ToolContext, reason: Option<&str>) -> Result<Writer, OpError> {
    let repo = match &ctx.worktree {
        // The git directory is root's: opened as the supervisor opens it
        // (its admin directory, read-only here), not through `.git`.
        Some(dir) => {
            let name = dir
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| OpError::Refused(format!("{}: not a worktree", dir.display())))?;
            crate::memfs::worktree::open(&ctx.agent, name)
                .map(|(_, repo)| repo)
                .map_err(|e| OpError::Refused(e.to_string()))?
        }
        None => repo::open_agent(&ctx.agent).map_err(|e| OpError::Refused(e.to_string()))?,
    };
    let channel = ctx.channel.clone();
    let reason = reason
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_string);
    Writer::with_remote_commit(
        repo,
        Box::new(move |paths: &[String], message: &str| {
            let message = match &reason {
                Some(r) => format!("{message}\n\n{r}"),
                None => message.to_string(),
            };
            let mut client = channel.lock().unwrap_or_else(|p| p.into_inner());
            match client.memory_commit(paths.to_vec(), message) {
                Ok(c) => Ok(CommitOutcome {
                    commit: c
                        .commit
                        .as_deref()
                        .and_then(|c| git2::Oid::from_str(c).ok()),
                    changed: c.changed,
                }),
                Err(ClientError::Remote(body)) => {
                    Err(OpError::Refused(body.message.trim_end().to_string()))
                }
                Err(e) => Err(OpError::Refused(format!(
                    "cannot reach the supervisor: {e}"
                ))),
            }
        }),
    )
}

/// A memory path from the model: relative, or absolute inside the memory dir.
fn memory_path(ctx: &ToolContext, p: &str) -> String {
    let mem = ctx.memory_dir();
    match Path::new(p).strip_prefix(&mem) {
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => p.to_string(),
    }
}

fn run(ctx: &ToolContext, args: &Args) -> ToolOutput {
    let s = |k: &str| string(args, k);
    let Some(command) = s("command") else {
        return ToolOutput::err(format!(
            "memory: 'command' must be one of {}",
            COMMANDS.join(", ")
        ));
    };
    match command {
        "delegate" => return delegate(ctx, args),
        "merge" => return merge(ctx, args),
        REPAIR_CONFLICT => return repair_conflict(ctx),
        _ => {}
    }
    let act = || match command {
        COMMIT => commit(ctx, args),
        _ => edit(ctx, args, command),
    };
    // A worktree is the sub-agent's alone.
    if ctx.worktree.is_some() {
        return act();
    }
    // Other turns of this agent edit the same working tree: hold the
    // agent's memory lease from the first read to the commit.
    if let Err(e) = lease(ctx, Call::MemoryLease { agent: None }) {
        return ToolOutput::err(format!("memory {command}: {e}"));
    }
    let out = act();
    let _ = lease(ctx, Call::MemoryRelease {});
    out
}

/// The paths a `commit` names (`file_paths`, or one `file_path`), relative
/// to the memory directory; `None` when it names none.
fn named_paths(ctx: &ToolContext, args: &Args) -> Result<Option<Vec<String>>, String> {
    if let Some(list) = args.get("file_paths").filter(|v| !v.is_null()) {
        let Some(items) = list.as_array() else {
            return Err("memory commit: 'file_paths' must be a list of strings".into());
        };
        let mut paths = Vec::with_capacity(items.len());
        for item in items {
            let Some(p) = item.as_str() else {
                return Err("memory commit: 'file_paths' must be a list of strings".into());
            };
            paths.push(memory_path(ctx, p));
        }
        return Ok((!paths.is_empty()).then_some(paths));
    }
    Ok(string(args, "file_path").map(|p| vec![memory_path(ctx, p)]))
}

/// `commit`: commit what is already changed in the memory directory (edits
/// made with Bash, Write or Edit), through the supervisor, which validates
/// it like every memory commit; `reason` is the message. Without paths,
/// every uncommitted change — as the supervisor sees the checkout (the
/// caller's worktree for a sub-agent), never a list the tool makes up.
fn commit(ctx: &ToolContext, args: &Args) -> ToolOutput {
    let Some(reason) = string(args, "reason")
        .map(str::trim)
        .filter(|r| !r.is_empty())
    else {
        return ToolOutput::err(
            "memory commit: 'reason' must be a non-empty string: it is the commit message",
        );
    };
    let named = match named_paths(ctx, args) {
        Ok(n) => n,
        Err(e) => return ToolOutput::err(e),
    };
    let mut client = ctx.channel.lock().unwrap_or_else(|p| p.into_inner());
    let paths = match named {
        Some(p) => p,
        None => match client.call_as::<replies::MemoryStatus>(Call::MemoryStatus { agent: None }) {
            Ok(status) => status.dirty,
            Err(ClientError::Remote(body)) => {
                return ToolOutput::err(format!("memory commit: {}", body.message));
            }
            Err(e) => {
                return ToolOutput::err(format!("memory commit: cannot reach the supervisor: {e}"));
            }
        },
    };
    if paths.is_empty() {
        return ToolOutput::ok(
            "Memory commit: nothing to commit, the memory has no uncommitted change.",
        );
    }
    match client.memory_commit(paths.clone(), reason.to_string()) {
        Ok(c) => match c.commit {
            Some(id) => ToolOutput::ok(format!(
                "Memory committed ({}): {}.",
                id.chars().take(7).collect::<String>(),
                if c.changed.is_empty() {
                    paths.join(", ")
                } else {
                    c.changed.join(", ")
                }
            )),
            None => ToolOutput::ok(format!(
                "Memory commit: nothing changed in {}.",
                paths.join(", ")
            )),
        },
        Err(ClientError::Remote(body)) => ToolOutput::err(format!(
            "memory commit: refused: {}",
            body.message.trim_end()
        )),
        Err(e) => ToolOutput::err(format!("memory commit: cannot reach the supervisor: {e}")),
    }
}

/// `repair_conflict`: after a `MEMORY GIT CONFLICT`, the supervisor sets
/// the local commits aside, moves memory to the remote's and has a repair
/// worker re-apply them; it checks the repair (every local change carried
/// over) and syncs. The call waits for that and reports how it ended.
fn repair_conflict(ctx: &ToolContext) -> ToolOutput {
    let mut client = ctx.channel.lock().unwrap_or_else(|p| p.into_inner());
    match client.call_as::<replies::MemorySynced>(Call::MemoryRepair {}) {
        Ok(synced) => {
            let (status, message) = (synced.outcome.status, &synced.outcome.message);
            let text = format!(
                "Memory sync after the repair: {}: {message}",
                status.as_str()
            );
            if status.is_settled() {
                ToolOutput::ok(text)
            } else {
                ToolOutput::err(text)
            }
        }
        Err(ClientError::Remote(body)) => {
            ToolOutput::err(format!("memory {REPAIR_CONFLICT}: {}", body.message))
        }
        Err(e) => ToolOutput::err(format!(
            "memory {REPAIR_CONFLICT}: cannot reach the supervisor: {e}"
        )),
    }
}

/// `delegate`: start a memory worker with a self-contained instruction; it
/// runs in the background and the supervisor merges what it commits.
fn delegate(ctx: &ToolContext, args: &Args) -> ToolOutput {
    let Some(instruction) = string(args, "instruction").filter(|s| !s.trim().is_empty()) else {
        return ToolOutput::err("memory delegate: 'instruction' must be a non-empty string");
    };
    let mut client = ctx.channel.lock().unwrap_or_else(|p| p.into_inner());
    match client.call_as::<replies::WorkerStarted>(Call::WorkerStart {
        instruction: instruction.to_string(),
    }) {
        Ok(w) if w.launched => ToolOutput::ok(format!(
            "Memory worker started (branch {}); it works in the background and its commits are merged when it finishes. Continue with your task.",
            w.branch.as_deref().unwrap_or("?")
        )),
        Ok(w) if w.queued => ToolOutput::ok(format!(
            "Memory worker queued (position {}): workers of this agent run one at a time.",
            w.position.unwrap_or(0)
        )),
        Ok(w) => ToolOutput::err(format!(
            "memory delegate: the worker was not started: {}",
            w.message.as_deref().unwrap_or("unknown reason")
        )),
        Err(ClientError::Remote(body)) => {
            ToolOutput::err(format!("memory delegate: {}", body.message))
        }
        Err(e) => ToolOutput::err(format!("memory delegate: cannot reach the supervisor: {e}")),
    }
}

/// `merge`: in a reflection's integration turn (the explicit merge mode),
/// merge the reflection branch under review into main. The supervisor knows
/// which branch that is; a `branch` given must be that one.
fn merge(ctx: &ToolContext, args: &Args) -> ToolOutput {
    let mut client = ctx.channel.lock().unwrap_or_else(|p| p.into_inner());
    let branch = string(args, "branch").unwrap_or_default().to_string();
    match client.call_as::<replies::Merged>(Call::MemoryMerge { branch }) {
        Ok(m) if m.status == "merged" => ToolOutput::ok(format!(
            "Merged the reflection branch {} into main ({}).",
            m.branch,
            m.merge_commit
                .as_deref()
                .map(|c| &c[..c.len().min(7)])
                .unwrap_or("?")
        )),
        Ok(m) => ToolOutput::err(format!(
            "memory merge: not merged ({}): {}",
            m.status, m.summary
        )),
        Err(ClientError::Remote(body)) => {
            ToolOutput::err(format!("memory merge: {}", body.message))
        }
        Err(e) => ToolOutput::err(format!("memory merge: cannot reach the supervisor: {e}")),
    }
}

/// Take or give back the memory lease.
fn lease(ctx: &ToolContext, call: Call) -> Result<(), String> {
    let mut client = ctx.channel.lock().unwrap_or_else(|p| p.into_inner());
    // Either answer says the request was taken; nothing in it is needed.
    match client.call_as::<serde::de::IgnoredAny>(call) {
        Ok(_) => Ok(()),
        Err(ClientError::Remote(body)) => Err(body.message),
        Err(e) => Err(format!("cannot reach the supervisor: {e}")),
    }
}

fn edit(ctx: &ToolContext, args: &Args, command: &str) -> ToolOutput {
    let s = |k: &str| string(args, k);
    let w = match writer(ctx, s("reason")) {
        Ok(w) => w,
        Err(e) => return ToolOutput::err(e.to_string()),
    };
    let need = |k: &str| {
        s(k).ok_or_else(|| OpError::Refused(format!("memory {command}: '{k}' must be a string")))
    };
    let path = |k: &str| need(k).map(|p| memory_path(ctx, p));
    let result = match command {
        "create" => (|| {
            let p = path("file_path")?;
            w.create(
                &p,
                s("description").unwrap_or(""),
                s("file_text").unwrap_or(""),
            )
        })(),
        "str_replace" => (|| {
            w.replace(
                &path("file_path")?,
                need("old_string")?,
                s("new_string").unwrap_or(""),
            )
        })(),
        "insert" => (|| {
            let line = args
                .get("insert_line")
                .and_then(Value::as_u64)
                .map(|n| n as usize);
            w.insert(&path("file_path")?, need("insert_text")?, line)
        })(),
        "delete" => (|| w.delete(&path("file_path")?))(),
        "rename" => (|| w.rename(&path("old_path")?, &path("new_path")?))(),
        "update_description" => (|| w.set_description(&path("file_path")?, need("description")?))(),
        other => Err(OpError::Refused(format!(
            "memory: unknown command {other:?} ({})",
            COMMANDS.join(", ")
        ))),
    };
    match result {
        Ok(o) => match o.commit {
            Some(c) => ToolOutput::ok(format!(
                "Memory {command} committed locally ({}).",
                &c.to_string()[..7]
            )),
            None => ToolOutput::ok(format!("Memory {command}: nothing changed.")),
        },
        Err(e) => ToolOutput::err(e.to_string()),
    }
}
