//! `mini-letta sandbox …`: run commands as a role's child would run.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::{Cli, terminal};
use crate::protocol::{Call, SpawnParams, StdioMode};
use crate::sandbox::probes::Verdict;
use crate::sandbox::report::{Isolation, SandboxReport};
use crate::supervisor::Session;
use std::os::fd::{AsFd, AsRawFd, RawFd};

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Run a command as a child of the given role, through the supervisor
    /// (an embedded one if none runs), passing stdio and the exit status
    /// through.
    Run(RunArgs),
    /// Print the confinement layers this host offers, the isolation level
    /// they reach (L0 best … L4), and why any layer is missing.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Run the escape catalogue: each attack in its own confined child of a
    /// throw-away attacker agent, next to a decoy agent, a decoy secret in
    /// the supervisor's environment and a sibling child. One line per
    /// attack (blocked, ESCAPED, skipped: reason) and a summary; exits 1 on
    /// any escape, or in strict mode when too few attacks could run.
    Verify {
        /// Role whose confinement is attacked.
        #[arg(long, default_value = "agent", value_parser = ["tool", "agent", "memory-worker", "reflection"])]
        role: String,
        #[arg(long, default_value = "strict", value_parser = ["strict", "degraded", "off"])]
        isolation: String,
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
    /// Pass the child's terminal output through untouched. By default, when
    /// run from a terminal, the child gets a pty of its own and only text
    /// and plain colour reach yours (no title, clipboard, cursor or mode
    /// sequences); your terminal's modes are restored when it ends.
    #[arg(long)]
    raw: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

pub fn run(cli: &Cli, cmd: &SandboxCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SandboxCommand::Run(args) => run_child(cli, args),
        SandboxCommand::Status { json } => status(*json),
        SandboxCommand::Verify {
            role,
            isolation,
            json,
        } => verify(role, isolation, *json),
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
    // The operator's terminal is never handed to the child: when any of our
    // stdio is one, the child gets a fresh pty and we relay it.
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let std_fds = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    let tty = std_fds
        .iter()
        .copied()
        .find(|fd| terminal::is_terminal(*fd));
    let pty = match tty {
        Some(like) => Some(terminal::open_pty(like).context("cannot open a pty for the child")?),
        None => None,
    };
    let passed: [RawFd; 3] = match &pty {
        Some(p) => [p.slave.as_raw_fd(); 3],
        None => [0, 1, 2],
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
            model: None,
        }),
        &passed,
    )?;
    // child.exit may arrive before the spawn response: remember them all.
    let mut exits = Vec::new();
    let spawned = client.wait_response_keeping_exits(id, &mut exits)?;
    let child = spawned["child"]
        .as_u64()
        .context("supervisor gave no child id")?;
    let relay = match pty {
        Some(p) => {
            drop(p.slave);
            let stdin_tty = terminal::is_terminal(std::io::stdin().as_fd());
            // Raw mode on our side: keys go to the child's pty as typed,
            // and the pty (not our terminal) echoes and edits.
            let raw_mode = if stdin_tty {
                Some(terminal::RawMode::enter(std::io::stdin().as_fd())?)
            } else {
                None
            };
            let master = std::sync::Arc::new(p.master);
            let m = master.clone();
            // Detached: a read of our stdin cannot be interrupted.
            std::thread::spawn(move || terminal::relay_input(&m, stdin_tty));
            let m = master.clone();
            let raw = args.raw;
            let out = std::thread::spawn(move || {
                terminal::relay_output(&m, raw, &mut std::io::stdout());
            });
            Some((out, raw_mode))
        }
        None => None,
    };
    let exit = client.wait_exit(child, &mut exits);
    if let Some((out, raw_mode)) = relay {
        // The output ends when the pty closes; a descendant still holding
        // it would keep it open, so wait only briefly after the exit.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while !out.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(raw_mode);
    }
    let exit = exit?;
    session.close();
    Ok(match (exit.code(), exit.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from((128 + sig) & 0xff).unwrap_or(1)),
        _ => ExitCode::FAILURE,
    })
}

fn status(json: bool) -> anyhow::Result<ExitCode> {
    let report = SandboxReport::probe();
    if json {
        super::output::json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("level:      {:?} ({})", report.level, report.backend);
    let line = |name: &str, l: &crate::sandbox::report::Layer| {
        println!(
            "{name:<11} {} — {}",
            if l.available { "yes" } else { "NO " },
            l.detail
        );
    };
    line("namespaces:", &report.namespaces);
    line("landlock:", &report.landlock);
    line("seccomp:", &report.seccomp);
    line("cgroup:", &report.cgroup);
    line("uid:", &report.uid_switch);
    line("nnp:", &report.no_new_privs);
    for m in &report.missing {
        println!("missing:    {m}");
    }
    println!(
        "strict mode {} this host",
        if Isolation::Strict.accepts(report.level) {
            "accepts"
        } else {
            "REFUSES children on"
        }
    );
    Ok(ExitCode::SUCCESS)
}

fn verify(role: &str, isolation: &str, json: bool) -> anyhow::Result<ExitCode> {
    let isolation: Isolation = isolation.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    let report = crate::verify::run(isolation, role, |r| {
        if json {
            return;
        }
        let verdict = match &r.verdict {
            Verdict::Blocked { .. } => "blocked".to_string(),
            Verdict::Escaped { .. } => "ESCAPED".to_string(),
            Verdict::Skipped { reason } => format!("skipped: {reason}"),
        };
        let detail = match &r.verdict {
            Verdict::Blocked { evidence } | Verdict::Escaped { evidence } => {
                format!(" ({evidence})")
            }
            Verdict::Skipped { .. } => String::new(),
        };
        println!(
            "{verdict:<8} #{:02} {:<28} {}{detail}",
            r.number, r.id, r.title
        );
    })?;
    if json {
        super::output::json(&serde_json::json!({
            "ok": report.ok(),
            "report": report,
        }))?;
    } else {
        println!(
            "{} blocked, {} escaped, {} skipped",
            report.blocked, report.escaped, report.skipped
        );
        for f in &report.failures {
            eprintln!("mini-letta: sandbox verify failed: {f}");
        }
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
