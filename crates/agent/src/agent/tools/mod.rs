//! The tools an agent may call (letta-code's names and schemas, spec
//! agent-loop.md §2.4, plus the book's `recall_search`), one file each. They
//! run inside the agent child, under its confinement; memory edits end in a
//! commit made by the supervisor, whose refusal text (the validator's block)
//! is the result.
//!
//! A tool is a `Tool` row of `TOOLS`: its name, the schema the model is
//! shown, and the function that runs a call. Adding one is a new file and a
//! new row.

use serde_json::Value;

use crate::protocol::messages::ToolSpec;

mod bash;
mod edit;
mod kit;
mod memory;
mod read;
mod recall_search;
mod roots;
pub mod schemas;
mod write;

pub use bash::{BASH_DEFAULT_TIMEOUT_MS, BASH_MAX_TIMEOUT_MS, OUTPUT_LIMIT};
pub use kit::{ToolContext, ToolOutput};
pub use memory::{
    COMMANDS as MEMORY_COMMANDS, COMMIT as MEMORY_COMMIT,
    REPAIR_CONFLICT as MEMORY_REPAIR_CONFLICT, method as memory_command_method,
};
pub use recall_search::line as recall_line;
pub use schemas::Schemas;

use kit::{Tool, truncate};

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
pub(crate) fn specs_named(names: &[String], window: Option<u64>) -> Vec<ToolSpec> {
    let form = Schemas::for_window(window);
    TOOLS
        .iter()
        .filter(|t| names.iter().any(|n| n == t.name))
        .map(|t| form.shape((t.spec)()))
        .collect()
}

/// The answer to a call of a tool the request did not carry (a model may
/// name one it was not offered; it must not run).
pub(crate) fn not_offered(name: &str, offered: &[ToolSpec], window: Option<u64>) -> ToolOutput {
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
}
