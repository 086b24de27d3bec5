//! `Read`: a file of the workspace or the memory directory, with line
//! numbers.

use serde_json::{Value, json};

use super::kit::{Args, Tool, ToolContext, ToolOutput, string, truncate};
use super::roots::readable_path;
use crate::protocol::messages::ToolSpec;

pub(super) const TOOL: Tool = Tool {
    name: "Read",
    spec,
    run,
};

fn spec() -> ToolSpec {
    ToolSpec {
        name: TOOL.name.into(),
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
    }
}

fn run(ctx: &ToolContext, args: &Args) -> ToolOutput {
    match string(args, "file_path") {
        Some(p) => read(
            ctx,
            p,
            args.get("offset").and_then(Value::as_u64),
            args.get("limit").and_then(Value::as_u64),
        ),
        None => ToolOutput::err("Read: 'file_path' must be a string"),
    }
}

fn read(ctx: &ToolContext, p: &str, offset: Option<u64>, limit: Option<u64>) -> ToolOutput {
    let path = match readable_path(ctx, p) {
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
