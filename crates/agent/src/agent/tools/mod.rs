//! The tools an agent may call (letta-code's names and schemas, spec
//! agent-loop.md §2.4, plus the book's `recall_search`), one file each. They
//! run inside the agent child, under its confinement; memory edits end in a
//! commit made by the supervisor, whose refusal text (the validator's block)
//! is the result.
//!
//! A tool is a `Tool` row of `TOOLS`: its name, the schema the model is
//! shown, and the function that runs a call. Adding one is a new file and a
//! new row.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::paths::AgentPaths;
use crate::protocol::client::Client;
use crate::protocol::messages::ToolSpec;

mod bash;
mod edit;
mod memory;
mod read;
mod recall_search;
pub mod schemas;
mod write;

pub use bash::{BASH_DEFAULT_TIMEOUT_MS, BASH_MAX_TIMEOUT_MS, OUTPUT_LIMIT};
pub use memory::{
    COMMANDS as MEMORY_COMMANDS, COMMIT as MEMORY_COMMIT,
    REPAIR_CONFLICT as MEMORY_REPAIR_CONFLICT, method as memory_command_method,
};
pub use recall_search::line as recall_line;
pub use schemas::Schemas;

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
    /// A sub-agent's memory worktree: the memory tool and `$MEMORY_DIR`
    /// point there instead of the agent's checkout, its commits land on
    /// the worktree's branch (the supervisor routes them), and no lease is
    /// taken (nobody else edits a worktree).
    pub worktree: Option<PathBuf>,
    /// A sub-agent whose view of the agent is read-only (recall): tools
    /// read what is on disk and write nothing.
    pub read_only: bool,
    /// Directories `Read` may read besides the memory directory and the
    /// workspace (a reflection's payloads, which its prompt tells it to
    /// read); never written by any tool.
    pub read_roots: Vec<PathBuf>,
}

impl ToolContext {
    /// The memory directory the tools edit: the worktree of a sub-agent,
    /// else the agent's checkout.
    pub fn memory_dir(&self) -> PathBuf {
        self.worktree
            .clone()
            .unwrap_or_else(|| self.agent.memory_dir())
    }
}

/// A call's arguments: always a JSON object by the time a tool sees them.
type Args = serde_json::Map<String, Value>;

/// One tool.
struct Tool {
    /// The name the model calls it by.
    name: &'static str,
    /// The schema the model is shown.
    spec: fn() -> ToolSpec,
    /// Run one call. Malformed arguments are a tool error, never a crash.
    run: fn(&ToolContext, &Args) -> ToolOutput,
}

/// Every tool, in the order the model is shown them.
const TOOLS: &[Tool] = &[
    memory::TOOL,
    bash::TOOL,
    read::TOOL,
    write::TOOL,
    edit::TOOL,
    recall_search::TOOL,
];

/// Every tool's name, in the order the model is shown them.
pub fn names() -> impl Iterator<Item = &'static str> {
    TOOLS.iter().map(|t| t.name)
}

/// Every tool's full schema.
pub fn specs() -> Vec<ToolSpec> {
    TOOLS.iter().map(|t| (t.spec)()).collect()
}

/// The schemas a main-agent request carries in `window` (the rule is
/// [`schemas`]'s: fewer and shorter as the window shrinks).
pub fn specs_for(window: Option<u64>) -> Vec<ToolSpec> {
    let form = Schemas::for_window(window);
    TOOLS
        .iter()
        .filter(|t| form.offers(t.name))
        .map(|t| form.shape((t.spec)()))
        .collect()
}

/// The schemas of the tools named in `names` (a sub-agent's set), in the
/// registry's order, shaped for `window`; unknown names are skipped.
pub fn specs_named(names: &[String], window: Option<u64>) -> Vec<ToolSpec> {
    let form = Schemas::for_window(window);
    TOOLS
        .iter()
        .filter(|t| names.iter().any(|n| n == t.name))
        .map(|t| form.shape((t.spec)()))
        .collect()
}

/// The answer to a call of a tool the request did not carry (a model may
/// name one it was not offered; it must not run).
pub fn not_offered(name: &str, offered: &[ToolSpec], window: Option<u64>) -> ToolOutput {
    let names: Vec<&str> = offered.iter().map(|t| t.name.as_str()).collect();
    let why = match window {
        Some(w) if TOOLS.iter().any(|t| t.name == name) => format!(
            " at this context window ({w} tokens: {} schemas)",
            Schemas::for_window(Some(w)).as_str()
        ),
        _ => String::new(),
    };
    ToolOutput::err(format!(
        "{name} is not offered{why}; the tools you have are: {}",
        names.join(", ")
    ))
}

/// Run one tool call. Malformed arguments are a tool error, never a crash.
pub fn execute(ctx: &ToolContext, name: &str, args: &Value) -> ToolOutput {
    let Some(args) = args.as_object() else {
        return ToolOutput::err(format!(
            "Invalid arguments for {name}: expected a JSON object, got {}",
            truncate(&args.to_string(), 200)
        ));
    };
    match TOOLS.iter().find(|t| t.name == name) {
        Some(tool) => (tool.run)(ctx, args),
        None => ToolOutput::err(format!("Unknown tool {name:?}")),
    }
}

/// A string argument.
fn string<'a>(args: &'a Args, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max).collect();
    format!("{cut}… [truncated]")
}

/// File tools act only in the workspace and the own memory directory.
fn allowed_path(ctx: &ToolContext, p: &str) -> Result<PathBuf, ToolOutput> {
    let roots: Vec<PathBuf> = [Some(ctx.memory_dir()), ctx.workspace.clone()]
        .into_iter()
        .flatten()
        .collect();
    inside_roots(p, &roots)
}

/// What `Read` may read: [`allowed_path`]'s directories and the context's
/// `read_roots`.
fn readable_path(ctx: &ToolContext, p: &str) -> Result<PathBuf, ToolOutput> {
    let mut roots: Vec<PathBuf> = [Some(ctx.memory_dir()), ctx.workspace.clone()]
        .into_iter()
        .flatten()
        .collect();
    roots.extend(ctx.read_roots.iter().cloned());
    inside_roots(p, &roots)
}

/// `p`, when it is absolute, has no `..` and resolves below one of `roots`.
fn inside_roots(p: &str, roots: &[PathBuf]) -> Result<PathBuf, ToolOutput> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The model sees the tools in a fixed order, each under the name it
    /// is dispatched by.
    #[test]
    fn specs_are_the_registry_in_order() {
        let names: Vec<String> = specs().into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            ["memory", "Bash", "Read", "Write", "Edit", "recall_search"]
        );
        for t in TOOLS {
            assert_eq!((t.spec)().name, t.name);
        }
    }

    /// A reflection is told to read its payload files: `Read` reaches its
    /// extra roots, and nothing beside them.
    #[test]
    fn read_roots_are_readable_and_only_they() {
        let t = tempfile::tempdir().expect("tmp");
        let payloads = t.path().join("reflections/payloads");
        std::fs::create_dir_all(payloads.join("l1")).expect("mkdir");
        std::fs::write(payloads.join("l1/c.json"), "[]").expect("write");
        std::fs::write(t.path().join("secret"), "x").expect("write");
        let file = payloads.join("l1/c.json");
        let file = file.to_str().expect("utf-8");
        assert!(inside_roots(file, std::slice::from_ref(&payloads)).is_ok());
        assert!(inside_roots(file, &[t.path().join("memory")]).is_err());
        let outside = t.path().join("reflections/payloads/../../secret");
        assert!(inside_roots(outside.to_str().expect("utf-8"), &[payloads]).is_err());
    }

    #[test]
    fn truncate_marks_what_it_cuts() {
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(truncate("abcd", 3), "abc… [truncated]");
        assert_eq!(truncate("ééé", 2), "éé… [truncated]");
    }
}
