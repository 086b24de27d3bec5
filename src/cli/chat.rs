//! `mini-letta chat` and `mini-letta attach` ([`attach`]), and the turn the
//! agent-side program (`mini-letta-agent turn`) runs in the confined child.
//!
//! A turn ([`turn`]): the CLI asks the supervisor (embedded if none runs) to
//! start a confined `agent` child, hands it the turn on stdin, and reads the
//! turn's events (NDJSON) from the child's stdout; model calls and memory
//! commits go from the child to the supervisor over the child's channel.
//!
//! What all of these print of a turn is decided in one place, [`render`].

pub(crate) mod args;
pub(crate) mod attach;
mod headless;
mod headless_args;
mod render;
pub(crate) mod turn;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::json;

use super::globals::Globals;
use super::interrupt;
use super::spinner::Spinner;
use crate::agent::context::window::env_windows;
use crate::console::output;
use crate::paths::Home;
use crate::protocol::timings;
use crate::protocol::turn::{TurnEvent, TurnInput};
use crate::store::record::AgentRecord;
use args::{ChatArgs, input_for, one_shot_text};
use render::{Detail, Printer};
use turn::{TurnRunner, precheck, runner_for};

pub fn chat(cli: &Globals, args: &ChatArgs) -> anyhow::Result<ExitCode> {
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
            crate::console::style::eprint_error(&format!(
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
fn token_line(cli: &Globals, usage: &crate::protocol::messages::Usage) {
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
    cli: &Globals,
    runner: &mut TurnRunner,
    home: &Home,
    record: &AgentRecord,
    args: &ChatArgs,
    input: &dyn Fn(&str, bool, bool) -> anyhow::Result<TurnInput>,
) -> anyhow::Result<ExitCode> {
    use rustyline::error::ReadlineError;
    use std::io::IsTerminal;
    let (mut rl, history) = line_editor(home, &record.id)?;
    eprintln!(
        "chatting with {} ({}); /help for commands; Ctrl-C cancels a turn, Ctrl-D leaves",
        output::text(&record.name),
        output::text(&record.id)
    );
    let mut chat = Interactive {
        cli,
        runner,
        home,
        record,
        args,
        input,
        recompile: args.recompile,
        new_session: true,
        printer: Printer::two_streams(std::io::stdout(), std::io::stderr())
            .clustered(clustered(home))
            .holding(!std::io::stdout().is_terminal()),
        state: ChatState {
            home: home.clone(),
            conversation: args.conversation.clone(),
            model: args.model.clone(),
            agent_model: record.model.clone(),
        },
    };
    let mut interrupted_once = false;
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
            if chat.slash_command(cmd)?.is_break() {
                break;
            }
            continue;
        }
        chat.turn(line)?;
        if let Some(sig) = interrupt::end_requested() {
            chat.runner.close();
            return Ok(ExitCode::from(128 + sig as u8));
        }
    }
    save_history(&mut rl, history.as_deref());
    chat.runner.close();
    Ok(ExitCode::SUCCESS)
}

/// The line editor, with the agent's history loaded, and the history
/// file: history is what a person typed at a terminal, per agent; piped
/// input (a script, a file) is never written to it.
fn line_editor(
    home: &Home,
    agent: &str,
) -> anyhow::Result<(rustyline::DefaultEditor, Option<PathBuf>)> {
    use std::io::IsTerminal;
    let mut rl = rustyline::DefaultEditor::new().context("cannot start line editing")?;
    let history = if std::io::stdin().is_terminal() {
        home.chat_history_file(agent).ok()
    } else {
        None
    };
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    Ok((rl, history))
}

/// Keep what was typed in the history file, if there is one (a failure
/// is a warning: the chat itself went well).
fn save_history(rl: &mut rustyline::DefaultEditor, history: Option<&Path>) {
    let Some(h) = history else {
        return;
    };
    if let Some(dir) = h.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = rl.save_history(h) {
        crate::console::style::eprint_warning(&format!(
            "cannot save the chat history to {}: {e}",
            h.display()
        ));
    }
}

/// An interactive chat between its lines: where its turns go, how they
/// print, and what the slash commands changed for the next turn.
struct Interactive<'a> {
    cli: &'a Globals,
    runner: &'a mut TurnRunner,
    home: &'a Home,
    record: &'a AgentRecord,
    args: &'a ChatArgs,
    input: &'a dyn Fn(&str, bool, bool) -> anyhow::Result<TurnInput>,
    /// The next turn recompiles the system prompt.
    recompile: bool,
    /// The next turn is the first of its session.
    new_session: bool,
    printer: Printer<std::io::Stdout, std::io::Stderr>,
    state: ChatState,
}

impl Interactive<'_> {
    /// Act on `/cmd`; `Break` when it leaves the chat.
    fn slash_command(&mut self, cmd: &str) -> anyhow::Result<ControlFlow<()>> {
        match slash(cmd, &mut self.state) {
            Slash::Quit => return Ok(ControlFlow::Break(())),
            Slash::Recompile => {
                self.recompile = true;
                eprintln!("(the next turn recompiles the system prompt)");
            }
            Slash::Said => {}
            Slash::NewConversation => {
                self.runner.close();
                *self.runner = runner_for(
                    self.home,
                    self.args,
                    &self.record.id,
                    &self.state.conversation,
                )?;
                self.new_session = true;
                eprintln!("(a new conversation: {})", self.state.conversation);
            }
            Slash::Run(sub) => run_self(self.home, &self.record.id, &self.state, sub),
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Run `line` as a turn, in the conversation and with the model the
    /// slash commands left.
    fn turn(&mut self, line: &str) -> anyhow::Result<()> {
        let mut turn_input = (self.input)(line, self.recompile, self.new_session)?;
        turn_input.conversation = self.state.conversation.clone();
        if self.state.model.is_some() {
            turn_input.model = self.state.model.clone();
        }
        let spinner = Spinner::new();
        let printer = &mut self.printer;
        let result = self.runner.run(&turn_input, &mut |e| {
            spin(&spinner, e);
            let _ = printer.event(e, Detail::Brief);
        });
        drop(spinner);
        self.printer.end_line()?;
        match result {
            Ok(TurnEvent::Done { usage, .. }) => {
                token_line(self.cli, &usage);
                self.new_session = false
            }
            Ok(_) => self.new_session = false,
            Err(e) => crate::console::style::eprint_error(&crate::console::one_line(&e)),
        }
        self.recompile = false;
        Ok(())
    }
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
                Err(e) => {
                    crate::console::style::eprint_error(&format!("/model {}: {e}", output::text(m)))
                }
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
            crate::console::style::eprint_error(&format!(
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
            crate::console::style::eprint_error(&format!("cannot find this program: {e}"));
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
        crate::console::style::eprint_error(&format!("/{}: {e}", sub[0]));
    }
}

/// Whether `home` is in a cluster (its turns are acknowledged once pushed).
fn clustered(home: &crate::paths::Home) -> bool {
    crate::cluster::ClusterConfig::load(home)
        .ok()
        .flatten()
        .is_some()
}
