//! `recall_search`: search the earlier messages of the agent's
//! conversations.

use serde_json::{Value, json};

use super::{Args, Tool, ToolContext, ToolOutput, string, truncate};
use crate::agent::conversation::Conversation;
use crate::protocol::messages::ToolSpec;

pub(super) const TOOL: Tool = Tool {
    name: "recall_search",
    spec,
    run,
};

fn spec() -> ToolSpec {
    ToolSpec {
        name: TOOL.name.into(),
        description: "Search earlier messages of your conversations.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
            "required": ["query"]
        }),
    }
}

fn run(ctx: &ToolContext, args: &Args) -> ToolOutput {
    match string(args, "query") {
        Some(q) => recall_search(
            ctx,
            q,
            args.get("limit").and_then(Value::as_u64).unwrap_or(10) as usize,
        ),
        None => ToolOutput::err("recall_search: 'query' must be a string"),
    }
}

/// Term-overlap search over the agent's stored messages (BM25 scoring comes
/// with the recall issue; this ranks by matched query terms, then recency).
fn recall_search(ctx: &ToolContext, query: &str, limit: usize) -> ToolOutput {
    let terms: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
    if terms.is_empty() {
        return ToolOutput::err("recall_search: empty query");
    }
    let mut hits: Vec<(usize, String, String)> = Vec::new();
    let convs = std::fs::read_dir(ctx.agent.conversations_dir())
        .into_iter()
        .flatten()
        .flatten();
    for entry in convs {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(conv) = Conversation::open(&ctx.agent, &name) else {
            continue;
        };
        for m in conv.messages() {
            let text = m.text();
            let lower = text.to_lowercase();
            let score = terms.iter().filter(|t| lower.contains(t.as_str())).count();
            if score > 0 {
                hits.push((
                    score,
                    m.ts.clone(),
                    format!("[{name} {} {:?}] {}", m.id, m.role, truncate(&text, 300)),
                ));
            }
        }
    }
    hits.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(&a.1)));
    if hits.is_empty() {
        return ToolOutput::ok(format!("No messages match {query:?}."));
    }
    ToolOutput::ok(
        hits.into_iter()
            .take(limit.max(1))
            .map(|h| h.2)
            .collect::<Vec<_>>()
            .join("\n"),
    )
}
