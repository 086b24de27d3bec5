//! `mini-letta sandbox …`: run commands as a role's child would run.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::Value;

use super::Cli;
use crate::protocol::{Call, SpawnParams, StdioMode};
use crate::supervisor::Session;

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Run a command as a child of the given role, through the supervisor
    /// (an embedded one if none runs), passing stdio and the exit status
    /// through.
    Run(RunArgs),
    /// Print which confinement layers are available (not implemented yet).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Run the escape catalogue against confined probes (not implemented yet).
    Verify {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Agent id or name.
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: String,
    /// Role whose confinement applies.
    #[arg(long, default_value = "tool", value_parser = ["tool", "agent", "memory-worker", "reflection"])]
    role: String,
    /// Directory to run in (default: the agent's directory).
    #[arg(long, value_name = "DIR")]
    workspace: Option<std::path::PathBuf>,
    /// strict (default): refuse unless every layer the role needs is active;
    /// degraded: accept fewer layers, loudly; off: no confinement at all.
    #[arg(long, default_value = "strict", value_parser = ["strict", "degraded", "off"])]
    isolation: String,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

pub fn run(cli: &Cli, cmd: &SandboxCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SandboxCommand::Run(args) => run_child(cli, args),
        SandboxCommand::Status { .. } => {
            anyhow::bail!(
                "sandbox status is not implemented yet (the confinement layers are being built)"
            )
        }
        SandboxCommand::Verify { .. } => {
            anyhow::bail!(
                "sandbox verify is not implemented yet (the confinement layers are being built)"
            )
        }
    }
}

fn run_child(cli: &Cli, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let workspace = match &args.workspace {
        Some(w) => Some(
            std::fs::canonicalize(w)
                .with_context(|| format!("workspace {}", w.display()))?
                .display()
                .to_string(),
        ),
        None => None,
    };
    let mut session = Session::open(&home)?;
    let client = &mut session.client;
    client.call(Call::Subscribe {})?;
    let id = client.send_request_with_fds(
        Call::Spawn(SpawnParams {
            agent: args.agent.clone(),
            role: args.role.clone(),
            argv: args.command.clone(),
            stdio: StdioMode::Passed,
            workspace,
            isolation: Some(args.isolation.clone()),
        }),
        &[0, 1, 2],
    )?;
    // child.exit may arrive before the spawn response: remember them all.
    let mut exits: Vec<Value> = Vec::new();
    let spawned = client.wait_response(id, |event, data| {
        if event == "child.exit" {
            exits.push(data.clone());
        }
    })?;
    let child = spawned["child"]
        .as_u64()
        .context("supervisor gave no child id")?;
    let exit = loop {
        if let Some(e) = exits.iter().find(|e| e["child"].as_u64() == Some(child)) {
            break e.clone();
        }
        match client.read_frame()? {
            crate::protocol::ServerFrame::Event { event, data } if event == "child.exit" => {
                exits.push(data)
            }
            _ => {}
        }
    };
    session.close();
    Ok(match (exit["code"].as_i64(), exit["signal"].as_i64()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from((128 + sig) & 0xff).unwrap_or(1)),
        _ => ExitCode::FAILURE,
    })
}
