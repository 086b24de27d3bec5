//! `mini-letta prompt`

use std::process::ExitCode;

use clap::Args;
use time::OffsetDateTime;

use super::{Cli, output};
use crate::agent::store;
use crate::memfs::compiler::{CompileOptions, compile_repo};

#[derive(Debug, Args)]
pub struct PromptArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Compile from HEAD now, ignoring the default conversation's cached
    /// system prompt (conversations/default/system-prompt.json).
    #[arg(long)]
    fresh: bool,
}

/// The conversation a prompt is shown for when none is named.
pub const DEFAULT_CONVERSATION: &str = "default";

pub fn run(cli: &Cli, args: &PromptArgs) -> anyhow::Result<ExitCode> {
    let (record, paths) = store::find(&cli.home()?, args.agent.as_deref())?;
    if !args.fresh
        && let Some(cached) = crate::agent::cache::load(&paths, DEFAULT_CONVERSATION)?
    {
        output::raw(cached.content.as_bytes())?;
        return Ok(ExitCode::SUCCESS);
    }
    let opts = CompileOptions {
        agent_id: &record.id,
        conversation_id: DEFAULT_CONVERSATION,
        system: &record.system,
        now: OffsetDateTime::now_utc(),
        previous_message_count: 0,
    };
    let repo = crate::memfs::repo::open_agent(&paths)?;
    let compiled = compile_repo(&repo, &opts)?;
    output::raw(compiled.content.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}
