//! `mini-letta doctor`: what is wrong with an agent and how to fix it.

use std::process::ExitCode;

use clap::Args;
use serde_json::json;

use super::globals::Globals;
use crate::console::output::{field, text};
use crate::doctor::{self, Context, Diagnosis};
use crate::store;

#[derive(Debug, Args)]
#[command(after_help = "\
Checks, in order: that agent uids can reach the home (as root) and that
config.toml parses and the agent's model names a provider (else no turn can
run); uncommitted changes or an unfinished merge/rebase in the
memory checkout; the committed memory against the validator; files over 80% of
their size limit; broken links in MEMORY.md indexes; conversations more than 50
steps since their last reflection; a stale reflection.lock; orphan memory
worktrees and kept branches; sync state ($MINI_LETTA_REMOTE_ROOT); a sandbox
level below L0; a missing or stale recall index.

Each finding is one line: severity (error, warning, info), check, what was
found, and a fix. The exit status is 1 when any error or warning was found.

Examples:
  mini-letta doctor
  mini-letta doctor -a owl --json")]
pub struct DoctorArgs {
    /// Agent id or name (default: the only agent, or every agent when
    /// there are several).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Print the findings as JSON: with -a, {"agent", "name", "healthy",
    /// "checks", "findings": [{"check", "severity", "message", "fix"}]};
    /// without, {"healthy", "agents": [...]}.
    #[arg(long)]
    json: bool,
}

pub fn run(cli: &Globals, args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let ctx = Context {
        remote_root: crate::remote::root_from_env(),
        sandbox: Some(crate::sandbox::report::SandboxReport::probe()),
        supervisor_running: doctor::supervisor_running(&home),
        home: Some(home.clone()),
    };
    let mut unreadable = 0;
    let agents = match &args.agent {
        Some(sel) => vec![store::find(&home, Some(sel))?],
        None => {
            let listing = store::list_all(&home)?;
            for u in &listing.unreadable {
                eprintln!(
                    "error: agent {} cannot be read: {} (fix: restore its agent.json)",
                    text(&u.id),
                    text(&u.reason)
                );
            }
            unreadable = listing.unreadable.len();
            if unreadable == 0 && listing.agents.is_empty() {
                anyhow::bail!(store::StoreError::NoAgents);
            }
            let mut out = Vec::new();
            for r in listing.agents {
                let paths = home.agent(&r.id)?;
                out.push((r, paths));
            }
            out
        }
    };
    let diagnoses: Vec<Diagnosis> = agents
        .iter()
        .map(|(record, paths)| doctor::diagnose(record, paths, &ctx))
        .collect();
    let healthy = unreadable == 0 && diagnoses.iter().all(|d| d.healthy);
    if args.json {
        if args.agent.is_some() && diagnoses.len() == 1 {
            crate::console::output::json(&diagnoses[0])?;
        } else {
            crate::console::output::json(&json!({ "healthy": healthy, "agents": diagnoses }))?;
        }
    } else {
        for d in &diagnoses {
            let problems = d
                .findings
                .iter()
                .filter(|f| f.severity != doctor::Severity::Info)
                .count();
            let (name, agent) = (field(&d.name), field(&d.agent));
            if problems == 0 {
                println!("{name} ({agent}): healthy");
            } else {
                println!("{name} ({agent}): {problems} problem(s)");
            }
            // Findings quote paths, branches and reasons from the agent's files.
            for f in &d.findings {
                println!(
                    "  {}: {}: {} (fix: {})",
                    f.severity.as_str(),
                    f.check,
                    text(&f.message),
                    text(&f.fix)
                );
            }
        }
    }
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
