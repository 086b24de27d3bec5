//! The agent-side program, `mini-letta-agent`: what the CLI and `sandbox
//! verify` ask the supervisor to run inside a confined child. It is a
//! program of its own so the user's command line (`mini-letta`) holds no
//! internal entry: nothing here appears in `mini-letta --help`, and the
//! user's command type cannot reach it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Started by mini-letta inside a confined child; not a user command.
#[derive(Debug, Parser)]
#[command(name = "mini-letta-agent", version)]
enum AgentProgram {
    /// Run the turn read from stdin (JSON) for the agent in DIR, writing
    /// turn events as JSON lines on stdout.
    Turn {
        /// The agent's directory (`<home>/agents/<id>`).
        #[arg(long, value_name = "DIR")]
        agent_dir: PathBuf,
        /// The conversation the supervisor started this turn for; the
        /// input must name the same one.
        #[arg(long, value_name = "ID")]
        conversation: Option<String>,
    },
    /// Run the sub-agent task (reflection, memory worker) the supervisor
    /// recorded for this child, in its worktree; exit 0 when it completed.
    Subagent {
        /// The agent's directory (`<home>/agents/<id>`).
        #[arg(long, value_name = "DIR")]
        agent_dir: PathBuf,
    },
    /// Run one escape probe and print its verdict as JSON.
    Probe {
        /// The probe's id, e.g. `fs-read-other-agent`.
        id: String,
        /// The context as JSON, or `-` to read it from stdin.
        #[arg(long)]
        context: String,
    },
    /// Talk to the supervisor over the channel this child was started with
    /// (descriptor `MINI_LETTA_CHANNEL_FD`).
    #[command(subcommand)]
    Channel(crate::cli::channel::ChannelCommand),
}

/// `mini-letta-agent`'s `main`.
pub fn agent_main() -> ExitCode {
    let program = AgentProgram::parse();
    crate::cli::init_logging(0);
    let result = match program {
        AgentProgram::Turn {
            agent_dir,
            conversation,
        } => crate::cli::agent_turn(&agent_dir, conversation.as_deref()),
        AgentProgram::Subagent { agent_dir } => subagent(&agent_dir),
        AgentProgram::Probe { id, context } => probe(&id, &context),
        AgentProgram::Channel(cmd) => crate::cli::channel::run(&cmd),
    };
    result.unwrap_or_else(|e| {
        eprintln!("mini-letta-agent: error: {}", crate::cli::one_line(&e));
        ExitCode::FAILURE
    })
}

fn subagent(agent_dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    use std::sync::{Arc, Mutex};
    let agent = crate::paths::AgentPaths::from_dir(agent_dir);
    let channel = Arc::new(Mutex::new(
        crate::protocol::client::Client::take_channel_env()?,
    ));
    let done = crate::agent::subagent::run(&agent, channel)?;
    tracing::info!(steps = done.steps, "sub-agent finished");
    Ok(ExitCode::SUCCESS)
}

fn probe(id: &str, context: &str) -> anyhow::Result<ExitCode> {
    use std::io::{Read, Write};
    let text = if context == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        context.to_string()
    };
    let ctx: crate::sandbox::probes::ProbeContext =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("invalid probe context: {e}"))?;
    let result = crate::sandbox::probes::run_one(id, &ctx);
    let mut out = std::io::stdout().lock();
    out.write_all(format!("{result}\n").as_bytes())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
