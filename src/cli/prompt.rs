//! `mini-letta prompt`

use std::process::ExitCode;

use clap::Args;
use time::OffsetDateTime;

use super::globals::Globals;
use crate::console::{output, style};
use crate::memfs::compiler::{CompileOptions, compile_repo};
use crate::paths::AgentPaths;
use crate::store;
use crate::store::conversation;
use crate::store::record::AgentRecord;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  mini-letta prompt
  mini-letta prompt -a owl --fresh
  mini-letta prompt --conversation work --json")]
pub struct PromptArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Compile from HEAD now, ignoring the conversation's cached system
    /// prompt (conversations/ID/system-prompt.json).
    #[arg(long)]
    fresh: bool,
    /// The conversation whose prompt to show; it must exist, except
    /// `default`.
    #[arg(long, value_name = "ID", default_value = DEFAULT_CONVERSATION)]
    conversation: String,
    /// Print {"agent", "conversation", "system", "cached", "compiled_at",
    /// "memfs_revision"} instead of the prompt: `cached` is true when the
    /// conversation's cached prompt was shown, false when compiled now;
    /// `memfs_revision` is the memory commit it was compiled from (null if
    /// none).
    #[arg(long)]
    json: bool,
}

/// The conversation a prompt is shown for when none is named.
pub const DEFAULT_CONVERSATION: &str = "default";

/// Refuse a conversation that does not exist (`default` always may), so a
/// mistyped id creates nothing.
pub(crate) fn require_conversation(
    agent: &AgentPaths,
    record: &AgentRecord,
    id: &str,
) -> anyhow::Result<()> {
    if id == DEFAULT_CONVERSATION
        || conversation::open_dir(agent, id, false)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .is_some()
    {
        return Ok(());
    }
    let mut known = conversation::list_ids(agent).map_err(|e| anyhow::anyhow!("{e}"))?;
    if !known.iter().any(|k| k == DEFAULT_CONVERSATION) {
        known.insert(0, DEFAULT_CONVERSATION.to_string());
    }
    anyhow::bail!(
        "no conversation {id:?} for agent {} (conversations: {})",
        record.name,
        known.join(", ")
    )
}

pub fn run(cli: &Globals, args: &PromptArgs) -> anyhow::Result<ExitCode> {
    let (record, paths) = store::find(&cli.home()?, args.agent.as_deref())?;
    let conversation = args.conversation.as_str();
    require_conversation(&paths, &record, conversation)?;
    let cached = if args.fresh {
        None
    } else {
        crate::store::system_prompt_file::load(&paths, conversation)?
    };
    let (system, compiled_at, revision, was_cached) = match cached {
        Some(c) => (c.content, c.compiled_at, c.memfs_revision, true),
        None => {
            let opts = CompileOptions {
                agent_id: &record.id,
                conversation_id: conversation,
                system: &record.system,
                now: OffsetDateTime::now_utc(),
                previous_message_count: 0,
            };
            let repo = crate::memfs::repo::open_agent(&paths)?;
            let c = compile_repo(&repo, &opts)?;
            (c.content, c.compiled_at, c.memfs_revision, false)
        }
    };
    // A cached prompt stays as compiled while memory moves on (turns see
    // the changes as memory updates): say so, or a reader takes the cache
    // for what memory holds now.
    let head = crate::memfs::repo::open_agent(&paths)?
        .head()
        .ok()
        .and_then(|h| h.target())
        .map(|h| h.to_string());
    let stale = was_cached && head.is_some() && head != revision;
    if stale {
        let short = |r: &Option<String>| {
            r.as_deref()
                .map(|r| r.chars().take(10).collect::<String>())
                .unwrap_or_else(|| "none".into())
        };
        style::eprint_note(&format!(
            "this is conversation {}'s cached prompt, compiled {} from memory {}; memory HEAD \
             is now {} (turns see the change as a memory update). `--fresh` shows a compile \
             of HEAD; `mini-letta recompile` replaces the cache.",
            output::field(conversation),
            output::display_stored_time(&compiled_at),
            short(&revision),
            short(&head),
        ));
    }
    if args.json {
        output::json(&serde_json::json!({
            "agent": record.id,
            "conversation": conversation,
            "system": system,
            "cached": was_cached,
            "compiled_at": compiled_at,
            "memfs_revision": revision,
            "memory_head": head,
            "stale": stale,
        }))?;
    } else {
        output::content(system.as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}
