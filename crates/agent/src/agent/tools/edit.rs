//! `Edit`: replace text in a file of the workspace or the memory directory.

use serde_json::{Value, json};

use super::kit::{Args, Tool, ToolContext, ToolOutput, string};
use super::roots::allowed_path;
use crate::protocol::messages::ToolSpec;

pub(super) const TOOL: Tool = Tool {
    name: "Edit",
    spec,
    run,
};

fn spec() -> ToolSpec {
    ToolSpec {
        name: TOOL.name.into(),
        description:
            "Replace text in a file (absolute path) in your workspace or memory directory.".into(),
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
    }
}

fn run(ctx: &ToolContext, args: &Args) -> ToolOutput {
    let s = |k: &str| string(args, k);
    match (s("file_path"), s("old_string"), s("new_string")) {
        (Some(p), Some(o), Some(n)) => edit(
            ctx,
            p,
            o,
            n,
            args.get("replace_all")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        ),
        _ => ToolOutput::err("Edit: 'file_path', 'old_string' and 'new_string' must be strings"),
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
