//! `mini-letta attach`: follow a conversation from another terminal, its
//! stored history first, then its turns as they run.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;
use serde_json::json;

use super::render::{self, Detail, Printer};
use crate::cli::conversations::warn_skipped;
use crate::cli::globals::Globals;
use crate::cli::terminal::clean;
use crate::protocol::turn::TurnEvent;
use crate::protocol::{Call, Event, ServerFrame, replies};
use crate::store;
use crate::store::conversation;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  mini-letta attach                                         # follows until Ctrl-C
  mini-letta attach -a owl --conversation work --last 20    # follows until Ctrl-C
  mini-letta attach --no-follow --json")]
pub struct AttachArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Conversation id to follow.
    #[arg(long, value_name = "ID", default_value = "default")]
    conversation: String,
    /// Messages of history to show before following.
    #[arg(long, default_value_t = 10)]
    last: usize,
    /// Print each stored message as a JSON line ({"id", "role", "parts",
    /// "ts", …}) and, when following live, each turn event as a JSON line.
    #[arg(long)]
    json: bool,
    /// Print the history and stop instead of following.
    #[arg(long)]
    no_follow: bool,
}

/// Follow a conversation: its stored history, then the running turns'
/// events live through the supervisor (or, without one, messages as they
/// are stored).
pub fn attach(cli: &Globals, args: &AttachArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let (record, agent) = store::find(&home, args.agent.as_deref())?;
    // Following is reading: a conversation is never created by it.
    crate::cli::prompt::require_conversation(&agent, &record, &args.conversation)?;
    let show = |m: &crate::store::conversation::StoredMessage| {
        if args.json {
            println!("{}", json!(m));
        } else {
            println!("{}", render::message(m));
        }
    };
    // Streamed: one message held at a time, whatever the agent wrote.
    let report = conversation::last_messages(&agent, &args.conversation, args.last, |m| show(&m))?
        .unwrap_or_default();
    warn_skipped(&args.conversation, &report);
    let mut end = report.end;
    if args.no_follow {
        return Ok(ExitCode::SUCCESS);
    }
    // With a supervisor running: its live events, text as it streams.
    if let Ok(mut client) = crate::supervisor::connect(&home) {
        client.call_as::<replies::Subscribed>(Call::Subscribe {})?;
        // Said once following has begun: what comes next is live.
        eprintln!(
            "following conversation {} live (Ctrl-C to stop)",
            clean(&args.conversation)
        );
        let me = agent
            .dir()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut printer = Printer::one_stream(std::io::stdout());
        loop {
            let ServerFrame::Event(event) = client.read_frame()? else {
                continue;
            };
            match event {
                // The text a child's model streams: the turn's text deltas.
                Event::TurnDelta(d) if d.agent.as_deref() == Some(me.as_str()) && !args.json => {
                    printer.event(&TurnEvent::TextDelta { text: d.text }, Detail::Full)?;
                }
                Event::TurnEvent(n) if n.agent == me && n.conversation == args.conversation => {
                    if args.json {
                        println!("{}", n.event);
                        std::io::stdout().flush()?;
                    } else if let Some(e) = n.turn_event() {
                        printer.event(&e, Detail::Full)?;
                    }
                }
                _ => {}
            }
        }
    }
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        // Only the lines appended since the last look are read.
        if let Some(report) =
            conversation::read_messages(&agent, &args.conversation, end, |m, _| show(&m))?
        {
            warn_skipped(&args.conversation, &report);
            end = report.end;
        }
        let _ = std::io::stdout().flush();
    }
}
