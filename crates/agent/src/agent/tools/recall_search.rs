//! `recall_search`: ranked search (BM25) over every message of the agent's
//! conversations, through the agent's recall index (`crate::recall`),
//! which this child catches up with its own logs first.

use serde_json::{Value, json};

use super::kit::{Args, Tool, ToolContext, ToolOutput, string};
use crate::protocol::messages::{Role, ToolSpec};
use crate::recall::{Filters, Hit};

pub(super) const TOOL: Tool = Tool {
    name: "recall_search",
    spec,
    run,
};

fn spec() -> ToolSpec {
    ToolSpec {
        name: TOOL.name.into(),
        // Kept as short as before the index: every request carries it, and
        // the tightest windows (900 tokens) have no room to spare. The
        // filters below are accepted when given (conversation, role,
        // since, until) but not advertised.
        description:
            "Search earlier messages of your conversations (subagent: a delegated search).".into(),
        parameters: json!({
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}, "subagent": {"type": "boolean"}},
            "required": ["query"]
        }),
    }
}

fn run(ctx: &ToolContext, args: &Args) -> ToolOutput {
    let Some(query) = string(args, "query") else {
        return ToolOutput::err("recall_search: 'query' must be a string");
    };
    if args.get("subagent").and_then(Value::as_bool) == Some(true) && !ctx.read_only {
        return delegate(ctx, query);
    }
    let limit = args
        .get("limit")
        .and_then(Value::as_u64)
        .unwrap_or(10)
        .clamp(1, 100) as usize;
    let mut filters = Filters {
        conversation: string(args, "conversation").map(str::to_string),
        ..Filters::default()
    };
    if let Some(r) = string(args, "role") {
        filters.role = match r {
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "tool" => Some(Role::Tool),
            _ => return ToolOutput::err("recall_search: 'role' is user, assistant or tool"),
        };
    }
    for (key, end) in [("since", false), ("until", true)] {
        if let Some(s) = string(args, key) {
            match Filters::parse_date(s, end) {
                Ok(t) if end => filters.until = Some(t),
                Ok(t) => filters.since = Some(t),
                Err(e) => return ToolOutput::err(format!("recall_search: {key}: {e}")),
            }
        }
    }
    // A read-only view (the recall sub-agent) catches up in memory only.
    let found = if ctx.read_only {
        crate::recall::search_read_only(&ctx.agent, query, &filters, limit)
    } else {
        crate::recall::search(&ctx.agent, query, &filters, limit)
    };
    match found {
        Ok(hits) if hits.is_empty() => ToolOutput::ok(format!("No messages match {query:?}.")),
        Ok(hits) => ToolOutput::ok(hits.iter().map(line).collect::<Vec<_>>().join("\n")),
        Err(e) => ToolOutput::err(format!("recall_search: {e}")),
    }
}

/// Delegate the search to a recall sub-agent (chapter 13): it starts from
/// this conversation and answers with its findings.
fn delegate(ctx: &ToolContext, query: &str) -> ToolOutput {
    use crate::protocol::Call;
    use crate::protocol::client::ClientError;
    let mut client = ctx.channel.lock().unwrap_or_else(|p| p.into_inner());
    match client.call_as::<crate::protocol::replies::Findings>(Call::RecallDelegate {
        query: query.to_string(),
    }) {
        Ok(f) => ToolOutput::ok(format!("Recall sub-agent findings:\n{}", f.findings)),
        Err(ClientError::Remote(body)) => {
            ToolOutput::err(format!("recall_search: {}", body.message))
        }
        Err(e) => ToolOutput::err(format!("recall_search: cannot reach the supervisor: {e}")),
    }
}

/// `[conversation msg-… role created_at score] snippet (evicted)`.
pub fn line(h: &Hit) -> String {
    format!(
        "[{} {} {} {} {:.3}] {}{}",
        h.conversation_id,
        h.message_id,
        role_name(h.role),
        h.created_at,
        h.score,
        h.snippet,
        if h.evicted { " (evicted)" } else { "" }
    )
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}
