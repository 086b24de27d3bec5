//! `Bash`: run a shell command in the agent's sandbox (the workspace, else
//! the memory directory), with a timeout, its output clamped.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::kit::{Args, Tool, ToolContext, ToolOutput, string, truncate};
use crate::protocol::messages::ToolSpec;

/// Bash output is clamped to this many characters.
pub const OUTPUT_LIMIT: usize = 30_000;
/// Default and largest Bash timeout, in milliseconds.
pub const BASH_DEFAULT_TIMEOUT_MS: u64 = 120_000;
pub const BASH_MAX_TIMEOUT_MS: u64 = 600_000;

pub(super) const TOOL: Tool = Tool {
    name: "Bash",
    spec,
    run,
};

fn spec() -> ToolSpec {
    ToolSpec {
        name: TOOL.name.into(),
        description:
            "Run a shell command inside your sandbox. Output is clamped to 30,000 characters."
                .into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "description": {"type": "string"},
                "timeout": {"type": "integer", "description": "Milliseconds (default 120000, max 600000)."}
            },
            "required": ["command", "description"]
        }),
    }
}

fn run(ctx: &ToolContext, args: &Args) -> ToolOutput {
    match string(args, "command") {
        Some(cmd) => bash(ctx, cmd, args.get("timeout").and_then(Value::as_u64)),
        None => ToolOutput::err("Bash: 'command' must be a string"),
    }
}

fn bash(ctx: &ToolContext, command: &str, timeout_ms: Option<u64>) -> ToolOutput {
    let timeout = Duration::from_millis(
        timeout_ms
            .unwrap_or(BASH_DEFAULT_TIMEOUT_MS)
            .clamp(1, BASH_MAX_TIMEOUT_MS),
    );
    let cwd = ctx.workspace.clone().unwrap_or_else(|| ctx.memory_dir());
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(&cwd)
        // The agent's channel stays the agent's (it is close-on-exec too).
        .env_remove(crate::protocol::CHANNEL_FD_ENV)
        .env("AGENT_ID", &ctx.agent_id)
        .env("CONVERSATION_ID", &ctx.conversation_id)
        .env("MEMORY_DIR", ctx.memory_dir())
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
    let pace = crate::retry::Policy::polling(Duration::from_millis(5), timeout);
    let status = match crate::retry::wait_child(&mut child, &pace) {
        Ok(Some(s)) => Some(s),
        Ok(None) => {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
            None
        }
        Err(e) => return ToolOutput::err(format!("Bash: {e}")),
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
