//! `mini-letta sync`: sync an agent's memory with its remote.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use super::globals::Globals;
use crate::console::output;
use crate::paths::{AgentPaths, Home};
use crate::protocol::{Call, replies};
use crate::store::record::AgentRecord;
use crate::store::{self, StoreError};
use crate::supervisor::Session;

#[derive(Debug, Args)]
#[command(after_help = "\
The remote is <MINI_LETTA_REMOTE_ROOT>/<agent-id>.git: a directory of bare
repositories (made on first use) or a git URL (the git CLI runs it, so your
credential helpers and ssh configuration apply). An agent that is only on the
remote is cloned first (by name on a directory root, by id on a URL); its
record (name, system prompt, model) travels in refs/mini-letta/agent. A sync fetches, fast-forwards
or rebases (after writing refs/mini-letta/backup/<time>), validates the tree it
would push, and pushes; it never force-pushes.

Statuses: skipped (no remote), clean, pushed, dirty (uncommitted memory edits),
conflict (a rebase conflict; nothing changed), invalid (the remote's memory,
or the rebased memory, fails validation, or the remote repository is refused;
nothing changed), push_failed. Whatever comes from the remote is validated
like a local commit before main moves.

With --repair, a conflict is handed to a repair worker instead of waiting for
the manual recipe (`git pull --rebase origin main`, edit, `git add`,
`GIT_EDITOR=true git rebase --continue`). The command waits for the repair,
then checks that every line the local commits added is on the new main: if
not, it names the paths not carried over, keeps the backup ref and exits 1.

Examples:
  mini-letta sync -a owl
  mini-letta sync -a owl --json
  mini-letta sync -a owl --repair")]
pub struct SyncArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// On a conflict, set the local commits aside (on a memory-worker
    /// branch, besides the backup ref), move main to the remote's, and let
    /// a repair worker re-apply the local change; it is pushed when merged
    /// and every local line is on the new main (else exit 1, backup kept).
    #[arg(long)]
    repair: bool,
}

/// [`store::find`], and an agent this host has never seen, named while a
/// remote is configured, cloned from the remote first (through the
/// supervisor, which runs every network git).
pub fn find_or_clone(
    home: &Home,
    selector: Option<&str>,
) -> anyhow::Result<(AgentRecord, AgentPaths)> {
    match store::find(home, selector) {
        Err(StoreError::NotFound(sel)) => {
            let Some(root) = crate::remote::root_from_env() else {
                return Err(StoreError::NotFound(sel).into());
            };
            eprintln!(
                "· agent {} is not on this host; cloning it from {}",
                output::text(&sel),
                output::text(&root)
            );
            let synced: replies::MemorySynced = Session::call_once(
                home,
                Call::MemorySync {
                    agent: Some(sel.clone()),
                    remote_root: Some(root),
                    repair: false,
                },
            )
            .with_context(|| format!("cannot clone agent {sel:?}"))?;
            Ok(store::find(home, Some(&synced.agent))?)
        }
        other => Ok(other?),
    }
}

pub fn run(cli: &Globals, args: &SyncArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let root = std::env::var(crate::memfs::sync::REMOTE_ROOT_ENV).ok();
    let v: replies::MemorySynced = Session::call_once(
        &home,
        Call::MemorySync {
            agent: args.agent.clone(),
            remote_root: root,
            repair: args.repair,
        },
    )
    .context("the sync could not run")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        // The message names files and refs the agent or the remote chose.
        println!(
            "{}: {}",
            output::field(v.outcome.status.as_str()),
            output::text(&v.outcome.message)
        );
    }
    Ok(if v.outcome.status.is_settled() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
