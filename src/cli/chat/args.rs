//! `mini-letta chat`'s options, and what a turn is made of from them:
//! the one-shot message, the workspace, each turn's input.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

use super::headless_args::HeadlessArgs;
use crate::agent::context::window::env_windows;
use crate::protocol::turn::TurnInput;

#[derive(Debug, Args)]
#[command(after_help = "\
One turn at a time runs per conversation: a second chat on a busy
conversation waits for the running turn (it says so), then runs.
Ctrl-C during a turn cancels that turn (the conversation records the
interruption); a second Ctrl-C, or Ctrl-D at the prompt, leaves.
MINI_LETTA_CONTEXT_WINDOW=N sets the context window of one run without
keeping it; MINI_LETTA_REFLECTION_CONTEXT_WINDOW=N the one reflection
sub-agents will get.

Examples:
  mini-letta chat -a alice -p '记住: I like tea'
  mini-letta chat -a alice -p - < question.txt
  mini-letta chat -a alice --prompt-file question.txt --json
  mini-letta chat -a alice --conversation work --model openai/gpt-4o-mini   # exits 1 without OPENAI_API_KEY
  mini-letta chat -a alice --context-window 900 -p 'hello'
  mini-letta chat -a alice -p 'hello' --output-format json
  mini-letta chat -a alice --output-format stream-json --input-format stream-json

letta-ai's SDK drives it with LETTA_CLI_PATH=scripts/letta-code-cli.mjs
(docs/letta-code-sdk.md); flags of letta-code's with no counterpart here
are accepted and noted on stderr.")]
pub struct ChatArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    pub(crate) agent: Option<String>,
    /// One message, one turn: print the reply and exit (`-` reads the
    /// message from stdin).
    #[arg(
        short = 'p',
        long = "prompt",
        value_name = "PROMPT",
        conflicts_with = "prompt_file"
    )]
    pub(crate) prompt: Option<String>,
    /// One turn with the message read from this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) prompt_file: Option<PathBuf>,
    /// Model handle for this chat (mock, mock/scripted, openai/<model>,
    /// anthropic/<model>); default: the agent's.
    #[arg(short = 'm', long, value_name = "M")]
    pub(crate) model: Option<String>,
    /// Conversation id (letters, digits, `-` and `_`).
    #[arg(long, value_name = "ID", default_value = "default")]
    pub(crate) conversation: String,
    /// With a one-shot message: print {"text", "stop_reason", "error",
    /// "events": [...]} instead of the reply.
    #[arg(long)]
    pub(crate) json: bool,
    /// A project directory the agent may read and write.
    #[arg(long, value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
    /// Confinement of the agent child: strict (default), degraded or off.
    #[arg(long, default_value = "strict", value_parser = ["strict", "degraded", "off"])]
    pub(crate) isolation: String,
    /// Most model requests in one turn.
    #[arg(long, value_name = "N")]
    pub(crate) max_steps: Option<u32>,
    /// Recompile the system prompt before the first step.
    #[arg(long)]
    pub(crate) recompile: bool,
    /// Context window of this conversation in tokens, kept for its later
    /// turns (default: $MINI_LETTA_CONTEXT_WINDOW for this run, else the
    /// conversation's, the agent's, the model's configured window). The
    /// conversation is compacted above window − min(16384, window / 5).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) context_window: Option<u64>,
    /// In a cluster: when another host owns the agent, wait up to SECS
    /// seconds for its ownership to end (its lease to expire, or a
    /// release) instead of being refused.
    #[arg(long, value_name = "SECS")]
    pub(crate) wait_owner: Option<u64>,
    /// With a one-shot message: where the turn's time went — the marks the
    /// CLI, the supervisor, the child stage and the agent program took, and
    /// the phases between them (on stderr; with --json, as "timings" in the
    /// document).
    #[arg(long)]
    pub(crate) timings: bool,
    #[command(flatten)]
    pub(crate) headless: Box<HeadlessArgs>,
}

/// Largest message read from stdin or a file.
const MAX_PROMPT_BYTES: u64 = 8 << 20;

/// The one-shot message, from `-p TEXT`, `-p -` (stdin) or `--prompt-file`.
pub(crate) fn one_shot_text(args: &ChatArgs) -> anyhow::Result<Option<String>> {
    use std::io::Read;
    let read = |r: &mut dyn Read, what: &str| -> anyhow::Result<String> {
        let mut bytes = Vec::new();
        r.take(MAX_PROMPT_BYTES + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read the message from {what}"))?;
        if bytes.len() as u64 > MAX_PROMPT_BYTES {
            bail!("the message in {what} is larger than {MAX_PROMPT_BYTES} bytes");
        }
        let text = String::from_utf8(bytes)
            .map_err(|_| anyhow::anyhow!("the message in {what} is not UTF-8"))?;
        let text = text.strip_suffix('\n').unwrap_or(&text).to_string();
        if text.trim().is_empty() {
            bail!("the message in {what} is empty");
        }
        Ok(text)
    };
    match (&args.prompt, &args.prompt_file) {
        (Some(p), _) if p == "-" => read(&mut std::io::stdin().lock(), "stdin").map(Some),
        (Some(p), _) => Ok(Some(p.clone())),
        (None, Some(f)) => {
            let mut file = std::fs::File::open(f)
                .with_context(|| format!("cannot open the prompt file {}", f.display()))?;
            read(&mut file, &f.display().to_string()).map(Some)
        }
        (None, None) => Ok(None),
    }
}

/// The project directory the agent may use, resolved.
pub(crate) fn workspace_of(args: &ChatArgs) -> anyhow::Result<Option<PathBuf>> {
    match &args.workspace {
        Some(w) => Ok(Some(
            std::fs::canonicalize(w).with_context(|| format!("workspace {}", w.display()))?,
        )),
        None => Ok(None),
    }
}

/// One turn's input: `text`, in `conversation`, with the settings `args`
/// gives.
pub(crate) fn input_for(
    args: &ChatArgs,
    conversation: &str,
    text: &str,
    recompile: bool,
    new_session: bool,
) -> anyhow::Result<TurnInput> {
    let (env_window, reflection_window) = env_windows()?;
    Ok(TurnInput {
        text: text.to_string(),
        conversation: conversation.to_string(),
        model: args.model.clone(),
        max_steps: args.max_steps,
        workspace: workspace_of(args)?.map(|w| w.display().to_string()),
        recompile,
        new_session,
        context_window: args.context_window,
        context_window_override: env_window,
        reflection_context_window: reflection_window,
        compact: None,
        timings: args.timings,
    })
}

/// The whole of stdin as one message (letta-code's headless mode with no
/// prompt given).
pub(crate) fn read_stdin_prompt() -> anyhow::Result<String> {
    let args = ChatArgs::stdin_prompt();
    one_shot_text(&args)?
        .ok_or_else(|| anyhow::anyhow!("no prompt provided: give -p TEXT, or the message on stdin"))
}

impl ChatArgs {
    /// `-p -` and nothing else.
    fn stdin_prompt() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            c: ChatArgs,
        }
        P::parse_from(["chat", "-p", "-"]).c
    }
}
