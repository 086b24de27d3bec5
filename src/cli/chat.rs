//! `mini-letta chat` and `mini-letta attach`, and the turn the agent-side
//! program (`mini-letta-agent turn`) runs in the confined child.
//!
//! A turn: the CLI asks the supervisor (embedded if none runs) to start a
//! confined `agent` child, hands it the turn on stdin, and reads the turn's
//! events (NDJSON) from the child's stdout; model calls and memory commits
//! go from the child to the supervisor over the child's channel.
//!
//! What all of these print of a turn is decided in one place, [`render`].

mod headless;
mod render;

use std::io::{BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::json;

use super::spinner::Spinner;
use super::terminal::clean;
use super::{Cli, interrupt, output};
use crate::agent::context::window::env_windows;
use crate::paths::{AgentPaths, Home};
use crate::protocol::client::ClientError;
use crate::protocol::events::ChildEnd;
use crate::protocol::timings;
use crate::protocol::turn::{TurnEvent, TurnInput};
use crate::protocol::{Call, ErrorCode, Event, ServerFrame, TurnParams, replies};
use crate::store;
use crate::store::conversation;
use crate::store::conversation::lines::{Line, LinePos, LogLines};
use crate::supervisor::Session;
use render::{Detail, Printer};

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
    agent: Option<String>,
    /// One message, one turn: print the reply and exit (`-` reads the
    /// message from stdin).
    #[arg(
        short = 'p',
        long = "prompt",
        value_name = "PROMPT",
        conflicts_with = "prompt_file"
    )]
    prompt: Option<String>,
    /// One turn with the message read from this file.
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// Model handle for this chat (mock, mock/scripted, openai/<model>,
    /// anthropic/<model>); default: the agent's.
    #[arg(short = 'm', long, value_name = "M")]
    model: Option<String>,
    /// Conversation id (letters, digits, `-` and `_`).
    #[arg(long, value_name = "ID", default_value = "default")]
    conversation: String,
    /// With a one-shot message: print {"text", "stop_reason", "error",
    /// "events": [...]} instead of the reply.
    #[arg(long)]
    json: bool,
    /// A project directory the agent may read and write.
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Confinement of the agent child: strict (default), degraded or off.
    #[arg(long, default_value = "strict", value_parser = ["strict", "degraded", "off"])]
    isolation: String,
    /// Most model requests in one turn.
    #[arg(long, value_name = "N")]
    max_steps: Option<u32>,
    /// Recompile the system prompt before the first step.
    #[arg(long)]
    recompile: bool,
    /// Context window of this conversation in tokens, kept for its later
    /// turns (default: $MINI_LETTA_CONTEXT_WINDOW for this run, else the
    /// conversation's, the agent's, the model's configured window). The
    /// conversation is compacted above window − min(16384, window / 5).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    context_window: Option<u64>,
    /// In a cluster: when another host owns the agent, wait up to SECS
    /// seconds for its ownership to end (its lease to expire, or a
    /// release) instead of being refused.
    #[arg(long, value_name = "SECS")]
    wait_owner: Option<u64>,
    /// With a one-shot message: where the turn's time went — the marks the
    /// CLI, the supervisor, the child stage and the agent program took, and
    /// the phases between them (on stderr; with --json, as "timings" in the
    /// document).
    #[arg(long)]
    timings: bool,
    #[command(flatten)]
    headless: Box<headless::HeadlessArgs>,
}

/// Largest message read from stdin or a file.
const MAX_PROMPT_BYTES: u64 = 8 << 20;

/// The one-shot message, from `-p TEXT`, `-p -` (stdin) or `--prompt-file`.
fn one_shot_text(args: &ChatArgs) -> anyhow::Result<Option<String>> {
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

/// Check what a turn needs before any runs: the conversation id's form and
/// the model (known form, key, valid `config.toml`). The supervisor checks
/// again; this makes an interactive chat fail at its start, not at its
/// first message.
pub(crate) fn precheck(
    home: &Home,
    agent: &AgentPaths,
    model: &str,
    conversation: &str,
) -> anyhow::Result<()> {
    agent.conversation(conversation)?;
    let cfg = crate::model::ProviderConfig::load(home)?;
    crate::model::open_model(model, &cfg)?;
    Ok(())
}

/// The project directory the agent may use, resolved.
fn workspace_of(args: &ChatArgs) -> anyhow::Result<Option<PathBuf>> {
    match &args.workspace {
        Some(w) => Ok(Some(
            std::fs::canonicalize(w).with_context(|| format!("workspace {}", w.display()))?,
        )),
        None => Ok(None),
    }
}

/// The turns of `agent` (an id) in `conversation`, as `args` asks.
fn runner_for(
    home: &Home,
    args: &ChatArgs,
    agent: &str,
    conversation: &str,
) -> anyhow::Result<TurnRunner> {
    Ok(TurnRunner::new(
        home.clone(),
        agent.to_string(),
        args.isolation.clone(),
        workspace_of(args)?,
        conversation.to_string(),
    )
    .wait_owner(args.wait_owner))
}

/// One turn's input: `text`, in `conversation`, with the settings `args`
/// gives.
fn input_for(
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
fn read_stdin_prompt() -> anyhow::Result<String> {
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

pub fn chat(cli: &Cli, args: &ChatArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let one_shot = one_shot_text(args)?;
    if args.timings {
        if one_shot.is_none() {
            bail!("--timings needs a one-shot message (-p TEXT, -p - or --prompt-file F)");
        }
        timings::enable_from_start("cli.main");
    }
    env_windows()?;
    interrupt::install();
    if args.headless.asked() {
        return headless::run(&home, args, one_shot);
    }
    let (record, agent) = super::sync::find_or_clone(&home, args.agent.as_deref())?;
    let model = args.model.clone().unwrap_or_else(|| record.model.clone());
    precheck(&home, &agent, &model, &args.conversation)?;
    let mut runner = runner_for(&home, args, &record.id, &args.conversation)?;
    let input = |text: &str, recompile: bool, new_session: bool| {
        input_for(args, &args.conversation, text, recompile, new_session)
    };
    let Some(prompt) = one_shot else {
        return interactive(cli, &mut runner, &home, &record, args, &input);
    };
    let mut events = Vec::new();
    let mut printer = Printer::two_streams(std::io::stdout(), std::io::stderr())
        .clustered(clustered(&home))
        .holding(!std::io::IsTerminal::is_terminal(&std::io::stdout()));
    let spinner = Spinner::new();
    let done = runner.run(&input(&prompt, args.recompile, true)?, &mut |e| {
        spin(&spinner, e);
        if args.json {
            events.push(json!(e));
        } else {
            let _ = printer.event(e, Detail::Brief);
        }
    });
    drop(spinner);
    runner.close();
    let done = done?;
    let TurnEvent::Done {
        stop_reason,
        text,
        usage,
        ..
    } = &done
    else {
        bail!("the turn ended without a result");
    };
    if args.json {
        let error = events
            .iter()
            .find(|e| e["type"] == "error")
            .map(|e| e["message"].clone());
        let mut doc = json!({
            "text": text,
            "stop_reason": stop_reason,
            "error": error,
            "events": events,
        });
        if args.timings {
            doc["timings"] = timings::document(&timings::taken());
        }
        output::json(&doc)?;
    } else {
        printer.end_line()?;
        token_line(cli, usage);
        if args.timings {
            eprint!("{}", timings::table(&timings::taken()));
        }
    }
    if let Some(sig) = interrupt::end_requested() {
        return Ok(ExitCode::from(128 + sig as u8));
    }
    Ok(match stop_reason.as_str() {
        "error" => ExitCode::FAILURE,
        "cancelled" => ExitCode::from(130),
        "max_steps" => {
            // Not an answer a script may take for one (issue 48).
            super::style::eprint_error(&format!(
                "the turn stopped after {} model requests without finishing; `--max-steps N` allows more",
                args.max_steps
                    .unwrap_or(crate::agent::runtime::DEFAULT_MAX_STEPS)
            ));
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    })
}

/// What a turn cost, on stderr for a person (a terminal, or `-v`).
fn token_line(cli: &Cli, usage: &crate::protocol::messages::Usage) {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() || cli.verbosity() > 0 {
        eprintln!(
            "· {} in / {} out tokens",
            usage.input_tokens, usage.output_tokens
        );
    }
}

/// The spinner runs while a model request is out.
fn spin(spinner: &Spinner, e: &TurnEvent) {
    match e {
        TurnEvent::Step { .. } | TurnEvent::ToolResult { .. } => spinner.waiting(),
        _ => spinner.done(),
    }
}

/// Longest line kept in the history file.
const MAX_HISTORY_LINE: usize = 4096;

fn interactive(
    cli: &Cli,
    runner: &mut TurnRunner,
    home: &Home,
    record: &crate::store::record::AgentRecord,
    args: &ChatArgs,
    input: &dyn Fn(&str, bool, bool) -> anyhow::Result<TurnInput>,
) -> anyhow::Result<ExitCode> {
    use rustyline::error::ReadlineError;
    use std::io::IsTerminal;
    let mut rl = rustyline::DefaultEditor::new().context("cannot start line editing")?;
    // History is what a person typed at a terminal, per agent; piped
    // input (a script, a file) is never written to it.
    let history = if std::io::stdin().is_terminal() {
        home.chat_history_file(&record.id).ok()
    } else {
        None
    };
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    eprintln!(
        "chatting with {} ({}); /help for commands; Ctrl-C cancels a turn, Ctrl-D leaves",
        output::text(&record.name),
        output::text(&record.id)
    );
    let mut recompile = args.recompile;
    let mut new_session = true;
    let mut printer = Printer::two_streams(std::io::stdout(), std::io::stderr())
        .clustered(clustered(home))
        .holding(!std::io::stdout().is_terminal());
    let mut interrupted_once = false;
    let mut state = ChatState {
        home: home.clone(),
        conversation: args.conversation.clone(),
        model: args.model.clone(),
        agent_model: record.model.clone(),
    };
    loop {
        let line = match rl.readline("> ") {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) if !interrupted_once => {
                interrupted_once = true;
                eprintln!("(press Ctrl-C again or Ctrl-D to leave)");
                continue;
            }
            Err(ReadlineError::Interrupted | ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        interrupted_once = false;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if history.is_some() && line.len() <= MAX_HISTORY_LINE {
            let _ = rl.add_history_entry(line);
        }
        if let Some(cmd) = line.strip_prefix('/') {
            match slash(cmd, &mut state) {
                Slash::Quit => break,
                Slash::Recompile => {
                    recompile = true;
                    eprintln!("(the next turn recompiles the system prompt)");
                }
                Slash::Said => {}
                Slash::NewConversation => {
                    runner.close();
                    *runner = runner_for(home, args, &record.id, &state.conversation)?;
                    new_session = true;
                    eprintln!("(a new conversation: {})", state.conversation);
                }
                Slash::Run(sub) => run_self(home, &record.id, &state, sub),
            }
            continue;
        }
        let mut turn_input = input(line, recompile, new_session)?;
        turn_input.conversation = state.conversation.clone();
        if state.model.is_some() {
            turn_input.model = state.model.clone();
        }
        let spinner = Spinner::new();
        let result = runner.run(&turn_input, &mut |e| {
            spin(&spinner, e);
            let _ = printer.event(e, Detail::Brief);
        });
        drop(spinner);
        printer.end_line()?;
        match result {
            Ok(TurnEvent::Done { usage, .. }) => {
                token_line(cli, &usage);
                new_session = false
            }
            Ok(_) => new_session = false,
            Err(e) => super::style::eprint_error(&super::one_line(&e)),
        }
        recompile = false;
        if let Some(sig) = interrupt::end_requested() {
            runner.close();
            return Ok(ExitCode::from(128 + sig as u8));
        }
    }
    if let Some(h) = &history {
        if let Some(dir) = h.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = rl.save_history(h) {
            super::style::eprint_warning(&format!(
                "cannot save the chat history to {}: {e}",
                h.display()
            ));
        }
    }
    runner.close();
    Ok(ExitCode::SUCCESS)
}

/// What the slash commands of an interactive chat change.
struct ChatState {
    home: Home,
    conversation: String,
    /// `/model M` (or `--model`): the model of the turns from now on.
    model: Option<String>,
    agent_model: String,
}

/// What a slash command asks of the chat loop.
enum Slash {
    Quit,
    Recompile,
    /// Answered already (help, the model, a refusal).
    Said,
    NewConversation,
    /// Another mini-letta command on this agent and conversation.
    Run(&'static [&'static str]),
}

/// The slash commands, as letta-code's users know them.
const SLASH_HELP: &str = "\
/help          this list
/model [M]     the model of this chat, or switch to M (mock, openai/<model>, anthropic/<model>)
/compact       compact this conversation now
/context       what this conversation's context holds
/memory        the agent's memory files
/recompile     recompile the system prompt before the next turn
/new           start a new conversation
/quit          leave (also /exit, Ctrl-D)";

/// Handle `/cmd`; never sent to the model, an unknown one included.
fn slash(cmd: &str, state: &mut ChatState) -> Slash {
    let mut words = cmd.split_whitespace();
    match (words.next().unwrap_or(""), words.next()) {
        ("quit" | "exit", _) => Slash::Quit,
        ("recompile", _) => Slash::Recompile,
        ("help", _) => {
            eprintln!("{SLASH_HELP}");
            Slash::Said
        }
        ("model", None) => {
            let m = state.model.as_deref().unwrap_or(&state.agent_model);
            eprintln!("(model: {})", output::text(m));
            Slash::Said
        }
        ("model", Some(m)) => {
            let checked = crate::model::ProviderConfig::load(&state.home)
                .map_err(anyhow::Error::from)
                .and_then(|cfg| crate::model::open_model(m, &cfg).map_err(anyhow::Error::from));
            match checked {
                Ok(_) => {
                    state.model = Some(m.to_string());
                    eprintln!("(the next turns use {})", output::text(m));
                }
                Err(e) => super::style::eprint_error(&format!("/model {}: {e}", output::text(m))),
            }
            Slash::Said
        }
        ("new", _) => {
            state.conversation = crate::store::new_prefixed_id("conv");
            Slash::NewConversation
        }
        ("compact", _) => Slash::Run(&["compact"]),
        ("context", _) => Slash::Run(&["context"]),
        ("memory", _) => Slash::Run(&["memory", "tree"]),
        (other, _) => {
            super::style::eprint_error(&format!(
                "unknown command /{} (not sent to the agent); the commands are:",
                output::text(other)
            ));
            eprintln!("{SLASH_HELP}");
            Slash::Said
        }
    }
}

/// Run `mini-letta SUB… -a AGENT [--conversation C]` for a slash command,
/// on this terminal (a separate process: the command's own code, output
/// and errors, exactly as typed on the command line).
fn run_self(home: &Home, agent: &str, state: &ChatState, sub: &[&str]) {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            super::style::eprint_error(&format!("cannot find this program: {e}"));
            return;
        }
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(sub)
        .arg("--home")
        .arg(home.root())
        .args(["-a", agent]);
    if sub[0] != "memory" {
        cmd.args(["--conversation", &state.conversation]);
    }
    if let Err(e) = cmd.status() {
        super::style::eprint_error(&format!("/{}: {e}", sub[0]));
    }
}

/// Runs turns of one agent's conversation through the home's supervisor,
/// opening (or re-opening) the session as needed.
pub struct TurnRunner {
    home: Home,
    session: Option<Session>,
    agent: String,
    isolation: String,
    workspace: Option<PathBuf>,
    conversation: String,
    /// `chat --wait-owner`.
    wait_owner: Option<u64>,
}

/// A turn the supervisor never read (it went away first): safe to send
/// again to the next one.
#[derive(Debug, thiserror::Error)]
#[error("the supervisor went away before taking the turn")]
struct NotTaken;

impl TurnRunner {
    /// Turns of `agent` (an id) in `conversation`.
    pub(crate) fn new(
        home: Home,
        agent: String,
        isolation: String,
        workspace: Option<PathBuf>,
        conversation: String,
    ) -> Self {
        Self {
            home,
            session: None,
            agent,
            isolation,
            workspace,
            conversation,
            wait_owner: None,
        }
    }

    /// In a cluster, wait up to `secs` for another owner (`--wait-owner`).
    pub(crate) fn wait_owner(mut self, secs: Option<u64>) -> Self {
        self.wait_owner = secs;
        self
    }

    fn session(&mut self) -> anyhow::Result<&mut Session> {
        if self.session.is_none() {
            let session = Session::open(&self.home)?;
            timings::mark("cli.connected");
            interrupt::set_stopper(session.stopper());
            self.session = Some(session);
        }
        self.session
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("no supervisor session"))
    }

    /// Run one turn; returns its `done` event (a cancelled turn's is
    /// made here, with stop reason `cancelled`).
    pub fn run(
        &mut self,
        input: &TurnInput,
        on_event: &mut dyn FnMut(&TurnEvent),
    ) -> anyhow::Result<TurnEvent> {
        let _guard = interrupt::begin_turn(&self.home, Some(&self.agent), &self.conversation);
        let once = || {
            let agent = self.agent.clone();
            let (isolation, workspace) = (self.isolation.clone(), self.workspace.clone());
            let conversation = self.conversation.clone();
            let wait_owner = self.wait_owner;
            let session = self.session()?;
            let done = turn(
                session,
                &agent,
                (&isolation, wait_owner),
                workspace.as_deref(),
                &conversation,
                input,
                on_event,
            );
            // Its supervisor went away: the next try opens a new session.
            if done.as_ref().is_err_and(|e| e.is::<NotTaken>())
                && let Some(s) = self.session.take()
            {
                s.close();
            }
            done
        };
        let not_taken = |e: &anyhow::Error| {
            let again = e.is::<NotTaken>();
            if again {
                tracing::debug!("{e}; sending the turn again");
            }
            again
        };
        crate::supervisor::RESEND_NOT_TAKEN
            .run(not_taken, once)
            .map_err(|e| supervisor_env_hint(&self.home, e))
    }

    /// Stop the embedded supervisor, if this command ran one (after the
    /// turns other commands run on it).
    pub fn close(&mut self) {
        interrupt::set_stopper(None);
        if let Some(s) = self.session.take() {
            s.close();
        }
    }
}

/// A key missing from the supervisor's environment that this command's
/// environment has: the advice to set it would be wrong (it is set — for
/// this command, not for the supervisor, which reads its own environment
/// when it starts). Say which supervisor and how to restart it.
fn supervisor_env_hint(home: &Home, e: anyhow::Error) -> anyhow::Error {
    let text = e.to_string();
    let Some(var) = text
        .contains("no API key for")
        .then(|| text.split("set ").nth(1))
        .flatten()
        .and_then(|rest| rest.split_whitespace().next())
        .filter(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
        .map(str::to_string)
    else {
        return e;
    };
    let pid = crate::supervisor::connect(home)
        .map(|c| c.server_pid.to_string())
        .unwrap_or_else(|_| "?".into());
    e.context(format!(
        "{var} is set for this command, but the running supervisor (pid {pid}) reads the \
         environment it was started with: restart it with the key set (`mini-letta supervisor \
         stop`, then `{var}=… mini-letta supervisor start`), or name it in config.toml \
         (api_key_env / api_key)"
    ))
}

/// The longest line of a turn child's stderr relayed to the operator.
const CHILD_ERR_LINE: usize = 64 * 1024;

/// Run one turn in a confined agent child; returns its `done` event.
///
/// One request (`turn.run`): the supervisor finds the agent and starts its
/// child on our pipes; we feed the turn's input, read its events, then read
/// the response, which comes when the child has exited.
fn turn(
    session: &mut Session,
    agent: &str,
    (isolation, wait_owner): (&str, Option<u64>),
    workspace: Option<&std::path::Path>,
    conversation: &str,
    input: &TurnInput,
    on_event: &mut dyn FnMut(&TurnEvent),
) -> anyhow::Result<TurnEvent> {
    let (in_r, mut in_w) = std::io::pipe()?;
    let (out_r, out_w) = std::io::pipe()?;
    // Not our stderr: the child's errors are relayed, cleaned of control
    // sequences, so the operator's terminal is never the child's.
    let (err_r, err_w) = std::io::pipe()?;
    let in_r = OwnedFd::from(in_r);
    let out_w = OwnedFd::from(out_w);
    let err_w = OwnedFd::from(err_w);
    let (relayed, relay_err) = std::sync::mpsc::channel::<()>();
    let relay = std::thread::spawn(move || {
        relay_child_errors(err_r);
        let _ = relayed.send(());
    });
    let client = &mut session.client;
    // Marked as the request is handed to the socket: the supervisor may
    // read it before this thread runs again.
    timings::mark("cli.sent");
    let sent = client.send_request_with_fds(
        Call::TurnRun(TurnParams {
            agent: Some(agent.to_string()),
            workspace: workspace.map(|w| w.display().to_string()),
            isolation: Some(isolation.to_string()),
            model: input.model.clone(),
            conversation: conversation.to_string(),
            context_window: input.context_window_override,
            reflection_context_window: input.reflection_context_window,
            wait_owner_secs: wait_owner,
            timings: input.timings,
        }),
        &[in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
    );
    drop(in_r);
    drop(out_w);
    drop(err_w);
    let req = match sent {
        Ok(r) => r,
        Err(ClientError::Io(_) | ClientError::Closed) => return Err(NotTaken.into()),
        Err(e) => return Err(e.into()),
    };
    // A refused turn (no such agent) closes the pipes unread: not an error
    // of ours, the response says why. The input goes on its own thread: a
    // large one fills the pipe until the child reads it, and a waiting
    // turn's child has not started yet.
    let text = serde_json::to_vec(input)?;
    let feeder = std::thread::spawn(move || in_w.write_all(&text));
    let (done, seen) = read_events(out_r, on_event)?;
    let ended: replies::TurnEnded = match client.wait_reply_with(req, "turn.run", |_| {}) {
        Ok(v) => v,
        Err(ClientError::Io(_) | ClientError::Closed) if seen == 0 => {
            return Err(NotTaken.into());
        }
        // A draining supervisor read it and said so.
        Err(e) if e.code() == Some(ErrorCode::NotTaken) => return Err(NotTaken.into()),
        Err(e) => return Err(e.into()),
    };
    timings::mark("cli.answered");
    timings::extend(ended.started.timings.clone().unwrap_or_default());
    let fed = feeder
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("input thread panicked")));
    let exit = Some(ended.exit);
    let launched = ended.reflection.as_ref().filter(|r| r.launched);
    let reflection = launched.map(|r| TurnEvent::Reflection {
        trigger: r.trigger.clone().unwrap_or_else(|| "automatic".into()),
        waits: session.is_embedded(),
    });
    wait_briefly(relay, relay_err);
    if ended.cancelled {
        let done = TurnEvent::Done {
            stop_reason: "cancelled".into(),
            text: String::new(),
            steps: 0,
            usage: Default::default(),
        };
        on_event(&done);
        return Ok(done);
    }
    if done.is_none() {
        fed.context("cannot hand the turn to the agent process")?;
    }
    if let Some(r) = &reflection {
        on_event(r);
    }
    done.with_context(|| {
        format!(
            "the agent process ended without finishing the turn (exit {}); the conversation is intact",
            match exit {
                Some(ChildEnd::Exited { code }) => code.to_string(),
                Some(ChildEnd::Killed { signal }) => format!("signal {signal}"),
                None => "unknown".into(),
            }
        )
    })
}

/// The child's stderr, relayed cleaned of control sequences, so the
/// operator's terminal is never the child's. Capped lines: an endless line
/// from the child must not grow the operator's process.
fn relay_child_errors(err_r: std::io::PipeReader) {
    for line in LogLines::resuming(BufReader::new(err_r), LinePos::default(), CHILD_ERR_LINE) {
        match line {
            Ok(Line::Text { bytes, .. }) => {
                eprintln!("{}", clean(&String::from_utf8_lossy(&bytes)));
            }
            Ok(Line::TooLong { len, .. }) => {
                eprintln!("(a line of {len} bytes from the agent was not shown)");
            }
            Err(_) => break,
        }
    }
}

/// The turn's events as they come, each handed to `on_event`: the `done`
/// event, and how many lines came at all (none means the turn never
/// started). Events are capped as log lines are: a message the turn may
/// store fits, an endless line is skipped without being held.
fn read_events(
    out_r: std::io::PipeReader,
    on_event: &mut dyn FnMut(&TurnEvent),
) -> anyhow::Result<(Option<TurnEvent>, usize)> {
    let mut done = None;
    let mut seen = 0usize;
    for line in LogLines::new(BufReader::new(out_r)) {
        let line = match line? {
            Line::Text { bytes, .. } => String::from_utf8_lossy(&bytes).into_owned(),
            Line::TooLong { len, .. } => {
                seen += 1;
                eprintln!("(an event of {len} bytes from the agent was not shown)");
                continue;
            }
        };
        seen += 1;
        match serde_json::from_str::<TurnEvent>(&line) {
            // The child's marks join this command's (checked there).
            Ok(TurnEvent::Timings { marks }) => timings::extend(marks),
            Ok(e) => {
                on_event(&e);
                if matches!(e, TurnEvent::Done { .. }) {
                    timings::mark("cli.done_event");
                    done = Some(e);
                }
            }
            Err(_) => eprintln!("{}", clean(&line)),
        }
    }
    Ok((done, seen))
}

/// The child's stderr closes with it; a lingering descendant could keep it
/// open, so wait only briefly — but do wait: the error that ended it is there.
/// Woken by the relay's own signal when it ends (a poll would add its
/// interval to every turn).
fn wait_briefly(relay: std::thread::JoinHandle<()>, relayed: std::sync::mpsc::Receiver<()>) {
    if relayed
        .recv_timeout(std::time::Duration::from_secs(2))
        .is_ok()
    {
        let _ = relay.join();
    }
}

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
pub fn attach(cli: &Cli, args: &AttachArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let (record, agent) = store::find(&home, args.agent.as_deref())?;
    // Following is reading: a conversation is never created by it.
    super::prompt::require_conversation(&agent, &record, &args.conversation)?;
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

/// Say once which lines of conversation `id`'s log a read skipped.
fn warn_skipped(id: &str, report: &conversation::LogReport) {
    for w in report.warnings() {
        super::style::eprint_warning(&format!("conversation {id}: {w}"));
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
pub fn conversations(cli: &Cli, args: &ConversationsArgs) -> anyhow::Result<ExitCode> {
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
                super::style::eprint_warning(&format!("conversation {name}: {e}"));
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
pub fn recompile(cli: &Cli, args: &RecompileArgs) -> anyhow::Result<ExitCode> {
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

/// Whether `home` is in a cluster (its turns are acknowledged once pushed).
fn clustered(home: &crate::paths::Home) -> bool {
    crate::cluster::ClusterConfig::load(home)
        .ok()
        .flatten()
        .is_some()
}
