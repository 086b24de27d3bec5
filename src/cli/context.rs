//! `mini-letta context` (a conversation's context window figures) and
//! `mini-letta compact` (compact a conversation now).

use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use serde_json::json;

use super::chat::turn::{TurnRunner, precheck};
use super::globals::Globals;
use super::prompt::{DEFAULT_CONVERSATION, require_conversation};
use crate::agent::context::compact::Mode;
use crate::agent::context::window::env_windows;
use crate::console::output;
use crate::protocol::turn::{TurnEvent, TurnInput};
use crate::reports::{ContextReport, context_report};
use crate::store;

#[derive(Debug, Args)]
#[command(after_help = "\
The window is, in order: $MINI_LETTA_CONTEXT_WINDOW, the conversation's own
(chat --context-window), the agent's (agent create --context-window), the
window config.toml gives the model. Tokens are estimated as a turn does:
the last reply's usage plus ceil(chars / 4) of what came after it. The
tools line lists what a request in this window carries and what each
costs (smaller windows carry fewer, shorter definitions). The reflection
window is $MINI_LETTA_REFLECTION_CONTEXT_WINDOW, else config.toml's
[reflection] context_window, else the conversation's.

Examples:
  mini-letta context
  mini-letta context -a owl --conversation work
  mini-letta context --json")]
pub struct ContextArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Conversation id; it must exist, except `default`.
    #[arg(long, value_name = "ID", default_value = DEFAULT_CONVERSATION)]
    conversation: String,
    /// Print {"context_window", "window_source", "threshold", "tokens",
    /// "messages_in_context", "messages_stored", "last_compaction", "tools",
    /// "tool_schemas", "reflection_context_window",
    /// "reflection_window_source", …}.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
The compaction runs as a turn of the conversation (it waits for a running
one), in the agent's confinement, and its summary is written by the
agent's model through the supervisor. The summarised messages leave the
context but stay in the log; the system prompt is recompiled.

Examples:
  mini-letta compact
  mini-letta compact -a owl --conversation work --mode all
  mini-letta compact --json")]
pub struct CompactArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Conversation id; it must exist, except `default`.
    #[arg(long, value_name = "ID", default_value = DEFAULT_CONVERSATION)]
    conversation: String,
    /// sliding_window summarises the oldest messages and keeps the recent
    /// ones; all summarises everything but a pending tool call (default:
    /// the agent's compaction mode, else sliding_window, which falls back
    /// to all when it cannot plan).
    #[arg(long, value_name = "MODE", value_parser = ["all", "sliding_window"])]
    mode: Option<String>,
    /// Confinement of the agent child: strict (default), degraded or off.
    #[arg(long, default_value = "strict", value_parser = ["strict", "degraded", "off"])]
    isolation: String,
    /// Print {"compacted", "compaction", "text", "stop_reason", "error"}.
    #[arg(long)]
    json: bool,
}

/// The window line: `900 tokens (conversation)` or why none is known.
pub(crate) fn window_text(r: &ContextReport) -> String {
    match r.window.context_window {
        Some(w) => format!("{w} tokens ({})", source_text(r)),
        None => "unknown (no setting, config.toml gives the model none and its window is not \
                 published): nothing compacts until the provider reports an overflow"
            .to_string(),
    }
}

fn source_text(r: &ContextReport) -> &'static str {
    use crate::agent::context::window::WindowSource as S;
    match r.window.source {
        S::Option => "--context-window",
        S::Environment => "$MINI_LETTA_CONTEXT_WINDOW",
        S::Conversation => "the conversation's setting",
        S::Agent => "the agent's setting",
        // The same figure from both is the published one, in effect.
        S::Provider if crate::model::windows::known_window(&r.model) == r.window.context_window => {
            "the model's published window; config.toml [model.context_windows] overrides it"
        }
        S::Provider => "config.toml for the model",
        S::None => "none",
    }
}

/// The tools a request carries, with their costs, and which schemas.
fn tools_text(r: &ContextReport) -> String {
    let each: Vec<String> = r
        .tools
        .iter()
        .map(|t| format!("{} {}", output::field(&t.name), t.tokens))
        .collect();
    format!(
        "{} ({} schemas for this window)",
        each.join(", "),
        r.tool_schemas.as_str()
    )
}

/// One line on the last compaction.
pub(crate) fn last_compaction_text(r: &ContextReport) -> String {
    match &r.last_compaction {
        None => "none".into(),
        Some(e) => format!(
            "{} {} ({}): {} → {} messages, about {} → {} tokens of messages{}",
            output::field(&output::display_stored_time(&e.at)),
            output::field(&e.trigger),
            output::field(&e.mode),
            e.messages_before,
            e.messages_after,
            e.tokens_before,
            e.tokens_after,
            match (&e.first_evicted_id, &e.last_evicted_id) {
                (Some(a), Some(b)) =>
                    format!(", {} … {} summarised", output::field(a), output::field(b)),
                _ => String::new(),
            }
        ),
    }
}

/// `mini-letta context`.
pub fn context(cli: &Globals, args: &ContextArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let (record, paths) = store::find(&home, args.agent.as_deref())?;
    require_conversation(&paths, &record, &args.conversation)?;
    let r = context_report(&home, &record, &paths, &args.conversation)?;
    if args.json {
        output::json(&r)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "conversation {} of {} ({}), model {}",
        output::field(&r.conversation),
        output::field(&r.name),
        output::field(&r.agent),
        output::field(&r.model)
    );
    println!("window:      {}", window_text(&r));
    if let (Some(t), Some(reserve)) = (r.window.threshold, r.window.reserve) {
        println!("threshold:   {t} (compacts above it; {reserve} kept free)");
    }
    let how = match &r.estimate.anchor {
        Some(id) => format!(
            "usage of {} {} + {} after it",
            output::field(id),
            r.estimate.usage_tokens,
            r.estimate.trailing_tokens
        ),
        None => format!(
            "system prompt {} + messages {} + tools {}",
            r.estimate.system_tokens, r.estimate.trailing_tokens, r.estimate.tool_tokens
        ),
    };
    println!(
        "tokens:      {}{} ({how})",
        r.tokens,
        if r.over_threshold {
            ", over the threshold: the next turn compacts what it can first"
        } else {
            ""
        }
    );
    println!(
        "messages:    {} in context, {} stored, {} compaction(s)",
        r.messages_in_context, r.messages_stored, r.compactions
    );
    println!("tools:       {}", tools_text(&r));
    println!("last compaction: {}", last_compaction_text(&r));
    if let Some(w) = r.window.reflection_context_window {
        println!(
            "reflection window: {w} tokens ({})",
            r.window.reflection_source.describe()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `mini-letta compact`.
/// The mode asked for, else the agent's, else the sliding window.
fn compaction_mode(record: &store::record::AgentRecord, asked: Option<&str>) -> String {
    match asked {
        Some(m) => m.to_string(),
        None => record
            .compaction_settings
            .as_ref()
            .and_then(|s| s.mode)
            .unwrap_or(Mode::SlidingWindow)
            .as_str()
            .to_string(),
    }
}

pub fn compact(cli: &Globals, args: &CompactArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let (record, paths) = store::find(&home, args.agent.as_deref())?;
    require_conversation(&paths, &record, &args.conversation)?;
    precheck(&home, &paths, &record.model, &args.conversation)?;
    let (env_window, reflection_window) = env_windows()?;
    let mode = compaction_mode(&record, args.mode.as_deref());
    // The figures `context` prints, before and after: what this command
    // reports is what that one will show next.
    let measure = || {
        context_report(&home, &record, &paths, &args.conversation)
            .ok()
            .map(|r| (r.messages_in_context, r.tokens))
    };
    let before = measure();
    super::interrupt::install();
    let mut runner = TurnRunner::new(
        home.clone(),
        record.id.clone(),
        args.isolation.clone(),
        None,
        args.conversation.clone(),
    );
    let input = TurnInput {
        text: String::new(),
        conversation: args.conversation.clone(),
        model: None,
        max_steps: None,
        workspace: None,
        recompile: false,
        new_session: false,
        context_window: None,
        context_window_override: env_window,
        reflection_context_window: reflection_window,
        compact: Some(mode),
        timings: false,
    };
    let mut compaction = None;
    let mut error = None;
    let done = runner.run(&input, &mut |e| match e {
        TurnEvent::Compaction { .. } => compaction = Some(json!(e)),
        TurnEvent::Error { message, .. } => error = Some(message.clone()),
        _ => {}
    });
    runner.close();
    let TurnEvent::Done {
        stop_reason, text, ..
    } = done?
    else {
        bail!("the compaction ended without a result");
    };
    let after = compaction.as_ref().and_then(|_| measure());
    let figures = |f: Option<(usize, u64)>| f.map(|(m, t)| json!({"messages": m, "tokens": t}));
    if args.json {
        output::json(&json!({
            "compacted": compaction.is_some(),
            "compaction": compaction,
            "text": text,
            "stop_reason": stop_reason,
            "error": error,
            "context_before": figures(before),
            "context_after": figures(after),
        }))?;
    } else if stop_reason == "error" {
        crate::console::style::eprint_error(&format!(
            "cannot compact conversation {} of {}: {}",
            args.conversation,
            record.name,
            error.as_deref().unwrap_or(&text)
        ));
    } else {
        let said = match (&compaction, before, after) {
            (Some(c), Some((mb, tb)), Some((ma, ta))) => format!(
                "compacted ({}): {mb} → {ma} messages in context, {tb} → {ta} tokens (as \
                 `mini-letta context` counts them: system prompt, messages and tools)",
                c["mode"].as_str().unwrap_or("?")
            ),
            _ => text.clone(),
        };
        println!(
            "{} / {}: {}",
            output::field(&record.name),
            output::field(&args.conversation),
            output::text(&said)
        );
    }
    Ok(match stop_reason.as_str() {
        "end_turn" => ExitCode::SUCCESS,
        "cancelled" => ExitCode::from(130),
        _ => ExitCode::FAILURE,
    })
}
