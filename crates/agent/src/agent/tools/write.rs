//! `Write`: a whole file of the workspace or the memory directory.

use serde_json::json;

use super::kit::{Args, Tool, ToolContext, ToolOutput, string};
use super::roots::allowed_path;
use crate::protocol::messages::ToolSpec;

pub(super) const TOOL: Tool = Tool {
    name: "Write",
    spec,
    run,
};

fn spec() -> ToolSpec {
    ToolSpec {
        name: TOOL.name.into(),
        description: "Write a file (absolute path) in your workspace or memory directory.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["file_path", "content"]
        }),
    }
}

fn run(ctx: &ToolContext, args: &Args) -> ToolOutput {
    match (string(args, "file_path"), string(args, "content")) {
        (Some(p), Some(c)) => write(ctx, p, c),
        _ => ToolOutput::err("Write: 'file_path' and 'content' must be strings"),
    }
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
