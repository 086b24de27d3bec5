//! `mini-letta recall`: ranked search over an agent's conversations, and
//! rebuilding its index.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;

use super::globals::Globals;
use crate::console::output;
use crate::protocol::messages::Role;
use crate::recall::{Filters, Index};
use crate::store;

#[derive(Debug, Subcommand)]
pub enum RecallCommand {
    /// Search every message of an agent's conversations, best first (BM25).
    Search(SearchArgs),
    /// Rebuild an agent's recall index from its conversation logs.
    #[command(after_help = "\
The index is rebuilt on its own when it is missing or stale; this forces it.

Examples:
  mini-letta recall reindex
  mini-letta recall reindex -a owl")]
    Reindex {
        /// Agent id or name (default: the only agent).
        #[arg(short = 'a', long = "agent", value_name = "AGENT")]
        agent: Option<String>,
    },
}

#[derive(Debug, Args)]
#[command(after_help = "\
Words match whole tokens (case and Unicode width folded); Chinese, Japanese
and Korean text matches by character and character pair, without spaces.
A \"quoted phrase\" must occur in a message; an unclosed quote is plain words.
Rows say (evicted) when compaction took the message out of its
conversation's context (the log keeps it).

Examples:
  mini-letta recall search 'green tea'
  mini-letta recall search -a owl '\"green tea\" price'
  mini-letta recall search 绿茶 --since 2026-01-01 --until 2026-01-31
  mini-letta recall search deploy --conversation work --role user --limit 5 --json")]
pub struct SearchArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Only this conversation.
    #[arg(long, value_name = "ID")]
    conversation: Option<String>,
    /// Only messages written on or after DATE (YYYY-MM-DD or RFC 3339).
    #[arg(long, value_name = "DATE")]
    since: Option<String>,
    /// Only messages written on or before DATE (YYYY-MM-DD, the whole day,
    /// or RFC 3339).
    #[arg(long, value_name = "DATE")]
    until: Option<String>,
    /// Only messages of this role.
    #[arg(long, value_name = "ROLE", value_parser = ["user", "assistant", "tool"])]
    role: Option<String>,
    /// At most N results.
    #[arg(long, value_name = "N", default_value_t = 10)]
    limit: usize,
    /// Print a JSON array of {"conversation_id", "message_id", "role",
    /// "kind", "created_at", "score", "snippet", "evicted"}.
    #[arg(long)]
    json: bool,
    /// Words and "quoted phrases" to search for.
    #[arg(value_name = "QUERY", required = true, num_args = 1..)]
    query: Vec<String>,
}

pub fn run(cli: &Globals, cmd: &RecallCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        RecallCommand::Search(args) => search(cli, args),
        RecallCommand::Reindex { agent } => {
            let home = cli.home()?;
            let (_, paths) = store::find(&home, agent.as_deref())?;
            let started = std::time::Instant::now();
            let mut index = Index::open_only(&paths)?;
            index.rebuild()?;
            println!(
                "indexed {} messages in {:.1?} ({} bytes)",
                index.len(),
                started.elapsed(),
                index.disk_size()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn search(cli: &Globals, args: &SearchArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let (_, paths) = store::find(&home, args.agent.as_deref())?;
    let mut filters = Filters {
        conversation: args.conversation.clone(),
        ..Filters::default()
    };
    if let Some(s) = &args.since {
        filters.since = Some(Filters::parse_date(s, false)?);
    }
    if let Some(s) = &args.until {
        filters.until = Some(Filters::parse_date(s, true)?);
    }
    filters.role = match args.role.as_deref() {
        Some("user") => Some(Role::User),
        Some("assistant") => Some(Role::Assistant),
        Some("tool") => Some(Role::Tool),
        _ => None,
    };
    let query = args.query.join(" ");
    let hits = crate::recall::search(&paths, &query, &filters, args.limit.max(1))?;
    if args.json {
        output::json(&json!(hits))?;
    } else if hits.is_empty() {
        println!("No messages match {query:?}.");
    } else {
        for h in &hits {
            println!("{}", hit_line(h));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One result in the agent's tool's format, every datum a field of stdout.
fn hit_line(h: &crate::recall::Hit) -> String {
    let f = |s: &str| output::field(s).into_owned();
    let shown = crate::recall::Hit {
        conversation_id: f(&h.conversation_id),
        message_id: f(&h.message_id),
        // To the second, as every other time the CLI prints (`--json`
        // keeps the stored time).
        created_at: f(&output::display_stored_time(&h.created_at)),
        snippet: f(&h.snippet),
        ..h.clone()
    };
    crate::agent::tools::recall_line(&shown)
}
