//! `mini-letta conversations` and `mini-letta recompile`: an agent's
//! conversations listed, and one conversation's system prompt compiled
//! from memory now.

use std::process::ExitCode;

use clap::Args;
use serde_json::json;

use super::globals::Globals;
use crate::console::output;
use crate::store;
use crate::store::conversation;

/// Say once which lines of conversation `id`'s log a read skipped.
pub(crate) fn warn_skipped(id: &str, report: &conversation::LogReport) {
    for w in report.warnings() {
        crate::console::style::eprint_warning(&format!("conversation {id}: {w}"));
    }
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  mini-letta conversations
  mini-letta conversations -a owl --json")]
pub struct ConversationsArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Print {"agent", "conversations": [{id, messages, in_context,
    /// last_message_at}]} instead of a table.
    #[arg(long)]
    json: bool,
}

/// `mini-letta conversations`: an agent's conversations.
pub fn conversations(cli: &Globals, args: &ConversationsArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let (record, agent) = store::find(&home, args.agent.as_deref())?;
    let mut rows = Vec::new();
    for name in conversation::list_ids(&agent)? {
        // Counted while streamed: no conversation is held whole.
        let counted = match conversation::summary(&agent, &name) {
            Ok(Some(c)) => {
                conversation::in_context_count(&agent, &name, c.messages).map(|n| (n, c))
            }
            Ok(None) => continue,
            Err(e) => Err(e),
        };
        let (in_context, conv) = match counted {
            Ok(c) => c,
            Err(e) => {
                crate::console::style::eprint_warning(&format!("conversation {name}: {e}"));
                continue;
            }
        };
        warn_skipped(&name, &conv.report);
        rows.push(json!({
            "id": name,
            "messages": conv.messages,
            "in_context": in_context,
            "last_message_at": conv.last_ts,
        }));
    }
    if args.json {
        output::json(&json!({ "agent": record.id, "conversations": rows }))?;
    } else if rows.is_empty() {
        println!("{} has no conversations yet", output::field(&record.name));
    } else {
        let mut table = output::Table::new(&["ID", "MESSAGES", "IN CONTEXT", "LAST MESSAGE"])
            .right(1)
            .right(2);
        for r in &rows {
            table.row(vec![
                r["id"].as_str().unwrap_or("").to_string(),
                r["messages"].to_string(),
                r["in_context"].to_string(),
                r["last_message_at"]
                    .as_str()
                    .map_or("-".into(), output::display_stored_time),
            ]);
        }
        table.print()?;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  mini-letta recompile
  mini-letta recompile -a owl --conversation work --json")]
pub struct RecompileArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Conversation id; it must exist, except `default`.
    #[arg(long, value_name = "ID", default_value = "default")]
    conversation: String,
    /// Print the new cached prompt {content, coreMemory, compiledAt, rawSystemHash, memfsRevision}.
    #[arg(long)]
    json: bool,
}

/// `mini-letta recompile`: compile the conversation's system prompt from
/// HEAD now and cache it (the next turn sends it instead of a memory update).
pub fn recompile(cli: &Globals, args: &RecompileArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let (record, agent) = store::find(&home, args.agent.as_deref())?;
    super::prompt::require_conversation(&agent, &record, &args.conversation)?;
    let conv = crate::store::conversation::Conversation::open(&agent, &args.conversation)?;
    let count = conv.context_ids()?.len() as u64;
    let prompt =
        crate::store::prompt_cache::resolve(&agent, &record, &args.conversation, count, true)?;
    let cached = crate::store::system_prompt_file::load(&agent, &args.conversation)?;
    if args.json {
        output::json(&cached)?;
    } else {
        let revision = cached
            .and_then(|c| c.memfs_revision)
            .unwrap_or_else(|| "none".into());
        println!(
            "recompiled {} / {} ({} bytes, memory revision {})",
            output::field(&record.name),
            output::field(&args.conversation),
            prompt.system.len(),
            output::field(&revision)
        );
    }
    Ok(ExitCode::SUCCESS)
}
