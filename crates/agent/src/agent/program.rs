//! The agent program, `mini-letta-agent`: what the CLI and `sandbox
//! verify` ask the supervisor to run inside a confined child. It is a
//! program of its own so the user's command line (`mini-letta`) holds no
//! internal entry: nothing here appears in `mini-letta --help`, and the
//! user's command type cannot reach it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::json;

use super::runtime::{emit_json_line, run_turn};
use crate::paths::AgentPaths;
use crate::protocol::Call;
use crate::protocol::client::Client;
use crate::protocol::turn::{TurnEvent, TurnInput};
use crate::store;

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
        #[arg(long, value_name = "ID", conflicts_with = "warm")]
        conversation: Option<String>,
        /// Started ahead of the turn: wait on the channel for the turn the
        /// supervisor hands over (its conversation and the caller's stdio).
        #[arg(long)]
        warm: bool,
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
    Channel(super::channel::ChannelCommand),
}

/// `mini-letta-agent`'s `main`.
pub fn agent_main() -> ExitCode {
    crate::protocol::timings::note_start();
    let program = AgentProgram::parse();
    crate::console::init_logging(0);
    let result = match program {
        AgentProgram::Turn {
            agent_dir,
            conversation,
            warm,
        } => turn(&agent_dir, conversation, warm),
        AgentProgram::Subagent { agent_dir } => subagent(&agent_dir),
        AgentProgram::Probe { id, context } => probe(&id, &context),
        AgentProgram::Channel(cmd) => super::channel::run(&cmd),
    };
    result.unwrap_or_else(|e| {
        eprintln!("mini-letta-agent: error: {}", crate::console::one_line(&e));
        ExitCode::FAILURE
    })
}

/// `mini-letta-agent turn`: run the turn read from stdin.
fn turn(
    agent_dir: &std::path::Path,
    conversation: Option<String>,
    warm: bool,
) -> anyhow::Result<ExitCode> {
    // A write past the file-size limit must be an error we report (and
    // undo), not a signal that kills the turn half-way through a line.
    // SAFETY: setting a signal to be ignored installs no handler code.
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGXFSZ,
            nix::sys::signal::SigHandler::SigIgn,
        )
    }
    .context("cannot ignore SIGXFSZ")?;
    // A warm child learns its turn only now: nothing of the agent is read
    // before the handover, so the turn sees the agent as it is then.
    let (conversation, warm_timings) = match warm {
        true => {
            let h = take_handover()?;
            (Some(h.conversation), h.timings)
        }
        false => (conversation, false),
    };
    let conversation = conversation.as_deref();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)?;
    let input: TurnInput = serde_json::from_str(&text).context("invalid turn input")?;
    if input.timings && !warm {
        start_timings();
    } else if warm_timings {
        crate::protocol::timings::mark("agent.input_read");
    }
    // The supervisor serialises turns per conversation by the one it was
    // asked for: the turn must be that one.
    if let Some(c) = conversation
        && c != input.conversation
    {
        bail!(
            "the turn input names conversation {:?}, but this turn was started for {c:?}",
            input.conversation
        );
    }
    let agent = AgentPaths::from_dir(agent_dir);
    let record = store::load(&agent)?;
    let client = Arc::new(Mutex::new(Client::take_channel_env()?));
    let channel = client.clone();
    let conversation = input.conversation.clone();
    // Events go to the CLI that started us (stdout) and, for `attach`, to
    // the supervisor (which sees the text deltas itself).
    let mut emit = |e: &TurnEvent| {
        emit_json_line(e);
        if !matches!(e, TurnEvent::TextDelta { .. })
            && let Ok(mut c) = channel.try_lock()
        {
            let _ = c.send_request(Call::TurnEvent {
                conversation: conversation.clone(),
                event: json!(e),
            });
        }
    };
    crate::protocol::timings::mark("agent.loaded");
    run_turn(&agent, &record, &input, client.clone(), &mut emit)?;
    if input.timings {
        crate::protocol::timings::mark("agent.done");
        emit_json_line(&TurnEvent::Timings {
            marks: crate::protocol::timings::taken(),
        });
    }
    Ok(ExitCode::SUCCESS)
}

/// A warm child's wait: the handover on its channel, then the caller's
/// descriptors become its stdin, stdout and stderr.
fn take_handover() -> anyhow::Result<crate::protocol::handover::Handover> {
    use crate::protocol::{CHANNEL_FD_ENV, handover};
    use std::os::fd::{AsFd, BorrowedFd};
    let fd: i32 = std::env::var(CHANNEL_FD_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .context("a warm turn needs its channel")?;
    // SAFETY: the stage left the channel open at this number for us; it
    // is only borrowed here (the protocol client takes it next).
    let channel = unsafe { BorrowedFd::borrow_raw(fd) };
    let (h, stdio) = handover::receive(channel)?;
    if h.timings {
        crate::protocol::timings::enable();
        crate::protocol::timings::mark("agent.handover");
    }
    for (at, fd) in stdio.iter().enumerate() {
        crate::sandbox::sys::install_fd(fd.as_fd(), at as i32)
            .context("cannot take the caller's descriptors")?;
    }
    Ok(h)
}

/// The turn asked for its marks: the stage's (from the environment it
/// handed over), this program's start, and from now on every step's.
fn start_timings() {
    use crate::protocol::timings;
    timings::enable_from_start("agent.main");
    if let Ok(stage) = std::env::var(timings::STAGE_ENV) {
        timings::extend(timings::decode(&stage));
    }
    timings::mark("agent.input_read");
}

fn subagent(agent_dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let agent = AgentPaths::from_dir(agent_dir);
    let channel = Arc::new(Mutex::new(
        crate::protocol::client::Client::take_channel_env()?,
    ));
    let done = crate::agent::subagent_loop::run(&agent, channel)?;
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
