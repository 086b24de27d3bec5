//! The tools an agent may call (letta-code's names and schemas, spec
//! agent-loop.md §2.4, plus the book's `recall_search`). They run inside the
//! agent child, under its confinement; memory edits end in a commit made by
//! the supervisor, whose refusal text (the validator's block) is the result.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::memfs::commit::CommitOutcome;
use crate::memfs::ops::{OpError, Writer};
use crate::memfs::repo;
use crate::paths::AgentPaths;
use crate::protocol::client::{Client, ClientError};
use crate::protocol::messages::ToolSpec;

/// Bash output is clamped to this many characters.
pub const OUTPUT_LIMIT: usize = 30_000;
/// Default and largest Bash timeout, in milliseconds.
pub const BASH_DEFAULT_TIMEOUT_MS: u64 = 120_000;
pub const BASH_MAX_TIMEOUT_MS: u64 = 600_000;

/// What a tool run produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    pub is_error: bool,
}

impl ToolOutput {
    fn ok(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: false,
        }
    }
    fn err(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: true,
        }
    }
}

/// Where tools act.
pub struct ToolContext {
    pub agent: AgentPaths,
    pub agent_id: String,
    pub conversation_id: String,
    pub workspace: Option<PathBuf>,
    /// The channel to the supervisor (memory commits).
    pub channel: Arc<Mutex<Client>>,
}

/// The schemas sent to the model.
pub fn specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "memory".into(),
            description: "Edit your memory files (Markdown in your memory directory) and commit the change. \
                Commands: create, str_replace (an empty new_string deletes every line containing old_string), \
                insert, delete, rename, update_description. Paths are relative to the memory directory."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["create", "str_replace", "insert", "delete", "rename", "update_description"]},
                    "reason": {"type": "string", "description": "Why: becomes part of the commit record."},
                    "file_path": {"type": "string"},
                    "old_path": {"type": "string"},
                    "new_path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"},
                    "insert_line": {"type": "integer", "minimum": 1},
                    "insert_text": {"type": "string"},
                    "description": {"type": "string"},
                    "file_text": {"type": "string"}
                },
                "required": ["command", "reason"]
            }),
        },
        ToolSpec {
            name: "Bash".into(),
            description: "Run a shell command inside your sandbox. Output is clamped to 30,000 characters.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "description": {"type": "string"},
                    "timeout": {"type": "integer", "description": "Milliseconds (default 120000, max 600000)."}
                },
                "required": ["command", "description"]
            }),
        },
        ToolSpec {
            name: "Read".into(),
            description: "Read a file (absolute path) with line numbers.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "file_path": {"type": "string"},
                    "offset": {"type": "integer", "minimum": 1},
                    "limit": {"type": "integer", "minimum": 1}
                },
                "required": ["file_path"]
            }),
        },
        ToolSpec {
            name: "Write".into(),
            description: "Write a file (absolute path) in your workspace or memory directory.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["file_path", "content"]
            }),
        },
        ToolSpec {
            name: "Edit".into(),
            description: "Replace text in a file (absolute path) in your workspace or memory directory.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "file_path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"},
                    "replace_all": {"type": "boolean"}
                },
                "required": ["file_path", "old_string", "new_string"]
            }),
        },
        ToolSpec {
            name: "recall_search".into(),
            description: "Search earlier messages of your conversations.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
                "required": ["query"]
            }),
        },
    ]
}

/// Run one tool call. Malformed arguments are a tool error, never a crash.
pub fn execute(ctx: &ToolContext, name: &str, args: &Value) -> ToolOutput {
    let Some(args) = args.as_object() else {
        return ToolOutput::err(format!(
            "Invalid arguments for {name}: expected a JSON object, got {}",
            truncate(&args.to_string(), 200)
        ));
    };
    let s = |k: &str| args.get(k).and_then(Value::as_str);
    match name {
        "memory" => memory(ctx, args),
        "Bash" => match s("command") {
            Some(cmd) => bash(ctx, cmd, args.get("timeout").and_then(Value::as_u64)),
            None => ToolOutput::err("Bash: 'command' must be a string"),
        },
        "Read" => match s("file_path") {
            Some(p) => read(
                ctx,
                p,
                args.get("offset").and_then(Value::as_u64),
                args.get("limit").and_then(Value::as_u64),
            ),
            None => ToolOutput::err("Read: 'file_path' must be a string"),
        },
        "Write" => match (s("file_path"), s("content")) {
            (Some(p), Some(c)) => write(ctx, p, c),
            _ => ToolOutput::err("Write: 'file_path' and 'content' must be strings"),
        },
        "Edit" => match (s("file_path"), s("old_string"), s("new_string")) {
            (Some(p), Some(o), Some(n)) => edit(
                ctx,
                p,
                o,
                n,
                args.get("replace_all")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            ),
            _ => {
                ToolOutput::err("Edit: 'file_path', 'old_string' and 'new_string' must be strings")
            }
        },
        "recall_search" => match s("query") {
            Some(q) => recall_search(
                ctx,
                q,
                args.get("limit").and_then(Value::as_u64).unwrap_or(10) as usize,
            ),
            None => ToolOutput::err("recall_search: 'query' must be a string"),
        },
        other => ToolOutput::err(format!("Unknown tool {other:?}")),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max).collect();
    format!("{cut}… [truncated]")
}

/// A writer whose commits go through the supervisor.
fn writer(ctx: &ToolContext) -> Result<Writer, OpError> {
    let repo = repo::open_agent(&ctx.agent).map_err(|e| OpError::Refused(e.to_string()))?;
    let channel = ctx.channel.clone();
    Writer::with_remote_commit(
        repo,
        Box::new(move |paths: &[String], message: &str| {
            let mut client = channel.lock().unwrap_or_else(|p| p.into_inner());
            match client.memory_commit(paths.to_vec(), message.to_string()) {
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
    let mem = ctx.agent.memory_dir();
    match Path::new(p).strip_prefix(&mem) {
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => p.to_string(),
    }
}

fn memory(ctx: &ToolContext, args: &serde_json::Map<String, Value>) -> ToolOutput {
    let s = |k: &str| args.get(k).and_then(Value::as_str);
    let Some(command) = s("command") else {
        return ToolOutput::err(
            "memory: 'command' must be one of create, str_replace, insert, delete, rename, update_description",
        );
    };
    let w = match writer(ctx) {
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
            "memory: unknown command {other:?} (create, str_replace, insert, delete, rename, update_description)"
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

fn bash(ctx: &ToolContext, command: &str, timeout_ms: Option<u64>) -> ToolOutput {
    let timeout = Duration::from_millis(
        timeout_ms
            .unwrap_or(BASH_DEFAULT_TIMEOUT_MS)
            .clamp(1, BASH_MAX_TIMEOUT_MS),
    );
    let cwd = ctx
        .workspace
        .clone()
        .unwrap_or_else(|| ctx.agent.memory_dir());
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(&cwd)
        // The agent's channel stays the agent's (it is close-on-exec too).
        .env_remove(crate::protocol::CHANNEL_FD_ENV)
        .env("AGENT_ID", &ctx.agent_id)
        .env("CONVERSATION_ID", &ctx.conversation_id)
        .env("MEMORY_DIR", ctx.agent.memory_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own process group, so a timeout kills everything it started.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return ToolOutput::err(format!("Bash: cannot start /bin/sh: {e}")),
    };
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut r| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.by_ref().take(4 * 1024 * 1024).read_to_end(&mut buf);
            // Drain the rest so the command never blocks on a full pipe.
            let _ = std::io::copy(&mut r, &mut std::io::sink());
            buf
        })
    })
    .collect();
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if started.elapsed() > timeout => {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return ToolOutput::err(format!("Bash: {e}")),
        }
    };
    let mut out = String::new();
    for r in readers {
        if let Ok(buf) = r.join() {
            out.push_str(&String::from_utf8_lossy(&buf));
        }
    }
    let mut text = truncate(&out, OUTPUT_LIMIT);
    match status {
        None => {
            text.push_str(&format!(
                "\nCommand timed out after {} ms",
                timeout.as_millis()
            ));
            ToolOutput::err(text)
        }
        Some(s) if s.success() => ToolOutput::ok(text),
        Some(s) => {
            text.push_str(&format!(
                "\nExit code: {}",
                s.code()
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "signal".into())
            ));
            ToolOutput::err(text)
        }
    }
}

/// File tools act only in the workspace and the own memory directory.
fn allowed_path(ctx: &ToolContext, p: &str) -> Result<PathBuf, ToolOutput> {
    let path = Path::new(p);
    if !path.is_absolute() {
        return Err(ToolOutput::err(format!("{p}: file_path must be absolute")));
    }
    if path
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(ToolOutput::err(format!("{p}: '..' is not allowed")));
    }
    let roots: Vec<PathBuf> = [Some(ctx.agent.memory_dir()), ctx.workspace.clone()]
        .into_iter()
        .flatten()
        .collect();
    // Resolve symlinks of the existing part so a link cannot lead outside.
    let existing = path.ancestors().find(|a| a.exists()).unwrap_or(path);
    let real = existing
        .canonicalize()
        .unwrap_or_else(|_| existing.to_path_buf());
    let inside = roots.iter().any(|r| {
        let r = r.canonicalize().unwrap_or_else(|_| r.clone());
        real.starts_with(&r)
    });
    if !inside {
        return Err(ToolOutput::err(format!(
            "{p}: outside your workspace and memory directory"
        )));
    }
    Ok(path.to_path_buf())
}

fn read(ctx: &ToolContext, p: &str, offset: Option<u64>, limit: Option<u64>) -> ToolOutput {
    let path = match allowed_path(ctx, p) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => return ToolOutput::err(format!("{p}: {e}")),
    };
    let text = String::from_utf8_lossy(&bytes);
    let start = offset.unwrap_or(1).max(1) as usize;
    let limit = limit.unwrap_or(2000).min(2000) as usize;
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .skip(start - 1)
        .take(limit)
        .map(|(i, l)| format!("{:>6}\t{}", i + 1, truncate(l, 2000)))
        .collect();
    ToolOutput::ok(lines.join("\n"))
}

fn write(ctx: &ToolContext, p: &str, content: &str) -> ToolOutput {
    let path = match allowed_path(ctx, p) {
        Ok(p) => p,
        Err(e) => return e,
    };
    if let Some(parent) = path.parent()
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        return ToolOutput::err(format!("{p}: {e}"));
    }
    match std::fs::write(&path, content) {
        Ok(()) => ToolOutput::ok(format!("Wrote {} bytes to {p}", content.len())),
        Err(e) => ToolOutput::err(format!("{p}: {e}")),
    }
}

fn edit(ctx: &ToolContext, p: &str, old: &str, new: &str, all: bool) -> ToolOutput {
    let path = match allowed_path(ctx, p) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => return ToolOutput::err(format!("{p}: {e}")),
    };
    if old.is_empty() || !text.contains(old) {
        return ToolOutput::err(format!("{p}: old_string not found"));
    }
    let count = text.matches(old).count();
    if count > 1 && !all {
        return ToolOutput::err(format!(
            "{p}: old_string occurs {count} times; pass replace_all or give more context"
        ));
    }
    let updated = if all {
        text.replace(old, new)
    } else {
        text.replacen(old, new, 1)
    };
    match std::fs::write(&path, updated) {
        Ok(()) => ToolOutput::ok(format!(
            "Edited {p} ({} replacement{})",
            if all { count } else { 1 },
            if all && count != 1 { "s" } else { "" }
        )),
        Err(e) => ToolOutput::err(format!("{p}: {e}")),
    }
}

/// Term-overlap search over the agent's stored messages (BM25 scoring comes
/// with the recall issue; this ranks by matched query terms, then recency).
fn recall_search(ctx: &ToolContext, query: &str, limit: usize) -> ToolOutput {
    let terms: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
    if terms.is_empty() {
        return ToolOutput::err("recall_search: empty query");
    }
    let mut hits: Vec<(usize, String, String)> = Vec::new();
    let convs = std::fs::read_dir(ctx.agent.conversations_dir())
        .into_iter()
        .flatten()
        .flatten();
    for entry in convs {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(conv) = super::conversation::Conversation::open(&ctx.agent, &name) else {
            continue;
        };
        for m in conv.messages() {
            let text = m.text();
            let lower = text.to_lowercase();
            let score = terms.iter().filter(|t| lower.contains(t.as_str())).count();
            if score > 0 {
                hits.push((
                    score,
                    m.ts.clone(),
                    format!("[{name} {} {:?}] {}", m.id, m.role, truncate(&text, 300)),
                ));
            }
        }
    }
    hits.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(&a.1)));
    if hits.is_empty() {
        return ToolOutput::ok(format!("No messages match {query:?}."));
    }
    ToolOutput::ok(
        hits.into_iter()
            .take(limit.max(1))
            .map(|h| h.2)
            .collect::<Vec<_>>()
            .join("\n"),
    )
}
