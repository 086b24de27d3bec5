//! `mini-letta supervisor …` and `mini-letta ps`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;

use super::globals::Globals;
use crate::console::output;
use crate::protocol::client::ClientError;
use crate::protocol::{Call, replies};
use crate::supervisor::{self, Started, Stopped};

#[derive(Debug, Subcommand)]
pub enum SupervisorCommand {
    /// Start the home's supervisor in the background (returns once its
    /// control socket answers). Idempotent: reports a running one.
    #[command(after_help = "Examples:
  mini-letta supervisor start
  mini-letta supervisor start --json
  mini-letta supervisor start --foreground   # runs until Ctrl-C or `supervisor stop`")]
    Start {
        /// Run in this process, in the foreground, until stopped.
        #[arg(long)]
        foreground: bool,
        /// Print {"running", "pid", "already_running"}.
        #[arg(long)]
        json: bool,
    },
    /// Stop the supervisor: children are asked to finish, then killed;
    /// in-flight commits complete. Forced after the timeout.
    #[command(after_help = "Examples:
  mini-letta supervisor stop
  mini-letta supervisor stop --timeout 30 --json")]
    Stop {
        /// Seconds to wait before escalating to signals.
        #[arg(long, default_value_t = 10)]
        timeout: u64,
        /// Print {"stopped", "pid"} (pid null when none was running).
        #[arg(long)]
        json: bool,
    },
    /// Whether a supervisor runs, and its pid, uptime and children
    /// (exit status 3 when none runs).
    #[command(after_help = "Examples:
  mini-letta supervisor status          # exits 3 when none runs
  mini-letta supervisor status --json   # exits 3 when none runs")]
    Status {
        /// Print {"running", "pid", "uptime_ms", "home", "socket", "version",
        /// "protocol", "children", "children_known", "cli_requests"}, or
        /// {"running": false, "home"} when none runs.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cli: &Globals, cmd: &SupervisorCommand) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    if let SupervisorCommand::Start { .. } = cmd {
        // A typo in config.toml is reported now, not at the first turn.
        let cfg =
            crate::model::ProviderConfig::load(&home).context("the supervisor was not started")?;
        if let Some(model) = &cfg.default_model {
            crate::model::open_model(model, &cfg)
                .map(drop)
                .with_context(|| format!("[model] default = {model:?} in config.toml"))
                .context("the supervisor was not started")?;
        }
    }
    match cmd {
        SupervisorCommand::Start {
            foreground: true, ..
        } => {
            supervisor::run_foreground(&home)?;
            Ok(ExitCode::SUCCESS)
        }
        SupervisorCommand::Start {
            foreground: false,
            json,
        } => {
            let started = supervisor::start_daemon(&home, Duration::from_secs(15))?;
            let (pid, already) = match started {
                Started::New(p) => (p, false),
                Started::AlreadyRunning(p) => (p, true),
            };
            if *json {
                output::json(&json!({ "running": true, "pid": pid, "already_running": already }))?;
            } else if already {
                println!("supervisor already running (pid {pid})");
            } else {
                println!("supervisor started (pid {pid})");
            }
            Ok(ExitCode::SUCCESS)
        }
        SupervisorCommand::Stop { timeout, json } => {
            let stopped = supervisor::stop(&home, Duration::from_secs(*timeout))?;
            let how = match stopped {
                None => "not_running",
                Some(Stopped::Clean(_)) => "stopped",
                Some(Stopped::Terminated(_)) => "terminated",
                Some(Stopped::Killed(_)) => "killed",
            };
            if *json {
                output::json(&json!({
                    "stopped": stopped.is_some(),
                    "pid": stopped.map(Stopped::pid),
                    "how": how,
                }))?;
            } else {
                match stopped {
                    Some(Stopped::Clean(pid)) => println!("supervisor stopped (pid {pid})"),
                    Some(Stopped::Terminated(pid)) => println!(
                        "supervisor stopped (pid {pid}) by SIGTERM: it did not stop within {timeout} s when asked"
                    ),
                    Some(Stopped::Killed(pid)) => println!(
                        "supervisor killed (pid {pid}): it did not stop when asked nor on SIGTERM; its pid and socket files were removed"
                    ),
                    None => println!("supervisor is not running"),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        SupervisorCommand::Status { json } => match supervisor::connect(&home) {
            // Refused (e.g. wrong uid) or broken: that is an error, not "not running".
            Err(e @ ClientError::Remote(_)) => Err(e.into()),
            Ok(mut c) => {
                let status: replies::SupervisorStatus = c.call_as(Call::Status {})?;
                if *json {
                    output::json(&status)?;
                } else {
                    println!(
                        "supervisor running (pid {}, up {} s, {} children) for {}",
                        status.pid,
                        status.uptime_ms / 1000,
                        status.children,
                        home.root().display()
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
            Err(_) => {
                if *json {
                    output::json(&json!({ "running": false, "home": home.root() }))?;
                } else {
                    println!("supervisor is not running for {}", home.root().display());
                }
                Ok(ExitCode::from(3))
            }
        },
    }
}

/// `mini-letta ps`: the running supervisor's live children (all it still
/// knows of with `all`).
pub fn ps(cli: &Globals, all: bool, json: bool) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let (children, running) = match supervisor::connect(&home) {
        Ok(mut c) => (c.call_as::<replies::Children>(Call::Ps {})?.children, true),
        Err(e @ ClientError::Remote(_)) => return Err(e.into()),
        Err(_) => (Vec::new(), false),
    };
    let children: Vec<replies::ChildRow> = children
        .into_iter()
        .filter(|c| all || c.state.is_live())
        .collect();
    if json {
        output::json(&json!({ "supervisor_running": running, "children": children }))?;
        return Ok(ExitCode::SUCCESS);
    }
    if !running {
        println!("supervisor is not running; no children");
        return Ok(ExitCode::SUCCESS);
    }
    if children.is_empty() {
        if all {
            println!("no children");
        } else {
            println!("no live children (`mini-letta ps --all` shows those that ended)");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = children
        .iter()
        .map(|c| {
            let state = match &c.state {
                replies::ChildState::Exited { code } => format!("exited {code}"),
                replies::ChildState::Killed { signal } => format!("killed by signal {signal}"),
                replies::ChildState::Warm => "warm".into(),
                replies::ChildState::Starting => "starting".into(),
                replies::ChildState::Running => "running".into(),
            };
            vec![
                c.id.to_string(),
                c.agent.clone(),
                c.agent_name.clone(),
                c.role.clone(),
                c.pid.to_string(),
                format!("{}s", c.uptime_ms / 1000),
                state,
            ]
        })
        .collect();
    let mut table = output::Table::new(&["ID", "AGENT", "NAME", "ROLE", "PID", "UPTIME", "STATE"])
        .right(0)
        .right(4)
        .right(5);
    for row in rows {
        table.row(row);
    }
    table.print()?;
    Ok(ExitCode::SUCCESS)
}
