//! `mini-letta reflect`: launch a reflection of an agent now, or show its
//! reflection state. The supervisor runs the reflection as a confined
//! child in a worktree and merges it when it exits.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::globals::Globals;
use crate::console::output;
use crate::protocol::replies::{ReflectLaunch, ReflectStatus, SubagentResult, TaskStatus};
use crate::protocol::{Call, ReflectParams};
use crate::supervisor::Session;

#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "\
A manual reflection ignores the backoff automatic ones observe after a failed
merge. It reads what the agent's conversations added since the last successful
reflection, edits a worktree of the memory repository in a confined child, and
the supervisor merges the worktree when the child exits.

With a running supervisor (`mini-letta supervisor start`) the command returns
once the reflection is launched; otherwise it waits for it (and says so), since
the supervisor it started ends with the command. --wait always waits.
It exits 0 when the reflection merged, changed nothing, or found nothing new
to reflect on; 1 when it could not run (the reason is printed).

The reflection has a context window of its own: the supervisor's
MINI_LETTA_REFLECTION_CONTEXT_WINDOW, else [reflection] context_window in
config.toml, else this command's, the agent's, the model's (`mini-letta
context` shows which). A tiny main window (900 tokens) is too small for one.

Examples:
  mini-letta reflect -a owl
  mini-letta reflect -a owl --instruction 'only facts about food' --wait
  mini-letta reflect status -a owl --json"
)]
pub struct ReflectArgs {
    #[command(subcommand)]
    command: Option<ReflectCommand>,
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// `auto`: the supervisor merges the reflection's branch; `explicit`:
    /// the agent reviews it first (default: the agent's setting).
    #[arg(long, value_parser = ["auto", "explicit"])]
    mode: Option<String>,
    /// Extra guidance for this reflection (what to keep, what to skip).
    #[arg(long, value_name = "TEXT")]
    instruction: Option<String>,
    /// Wait until the reflection has been merged or discarded.
    #[arg(long)]
    wait: bool,
    /// Isolation of the reflection's child: strict (default), degraded, off.
    #[arg(long, value_name = "LEVEL", value_parser = ["strict", "degraded", "off"])]
    isolation: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
pub enum ReflectCommand {
    /// Show or change when an agent reflects on its own: every N steps
    /// (a step is one model response), after each compaction, or never;
    /// and how its reflections are merged.
    #[command(after_help = "\
Examples:
  mini-letta reflect settings -a owl
  mini-letta reflect settings -a owl --trigger step-count --step-count 10
  mini-letta reflect settings -a owl --trigger compaction-event
  mini-letta reflect settings -a owl --trigger off --json
  mini-letta reflect settings -a owl --merge explicit --merge-instructions 'keep it short'")]
    Settings {
        /// Agent id or name (default: the only agent).
        #[arg(short = 'a', long = "agent", value_name = "AGENT")]
        agent: Option<String>,
        /// When automatic reflections run.
        #[arg(long, value_parser = ["off", "step-count", "compaction-event"])]
        trigger: Option<String>,
        /// Steps between automatic reflections (with --trigger step-count).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        step_count: Option<u32>,
        /// auto: the supervisor merges; explicit: the agent reviews first.
        #[arg(long, value_parser = ["auto", "explicit"])]
        merge: Option<String>,
        /// Guidance for the agent's review in the explicit mode (empty: none).
        #[arg(long, value_name = "TEXT")]
        merge_instructions: Option<String>,
        /// Print the settings as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show an agent's reflection state: lock, backoff, last result and
    /// each conversation's cursor and steps since its last reflection.
    #[command(after_help = "Examples:
  mini-letta reflect status -a owl
  mini-letta reflect status -a owl --json")]
    Status {
        /// Agent id or name (default: the only agent).
        #[arg(short = 'a', long = "agent", value_name = "AGENT")]
        agent: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cli: &Globals, args: &ReflectArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    if let Some(ReflectCommand::Settings {
        agent,
        trigger,
        step_count,
        merge,
        merge_instructions,
        json,
    }) = &args.command
    {
        let change = SettingsChange {
            trigger: trigger.as_deref(),
            step_count: *step_count,
            merge: merge.as_deref(),
            merge_instructions: merge_instructions.as_deref(),
        };
        return settings_command(&home, agent.as_deref(), &change, *json);
    }
    if let Some(ReflectCommand::Status { agent, json }) = &args.command {
        let status: ReflectStatus = Session::call_once(
            &home,
            Call::ReflectStatus {
                agent: agent.clone(),
            },
        )?;
        if *json {
            println!("{}", serde_json::to_string_pretty(&status)?);
        } else {
            print_status(&status);
        }
        return Ok(ExitCode::SUCCESS);
    }
    // The reflection's own window, else the main one (book lab 4: without
    // its own setting a reflection shares the conversation's window).
    let (main_window, reflection_window) = crate::agent::context::window::env_windows()?;
    let window = reflection_window.or(main_window);
    let mut session = Session::open(&home)?;
    let wait = args.wait || session.is_embedded();
    if wait && !args.wait && !args.json {
        eprintln!("· no supervisor is running: waiting for the reflection to finish");
    }
    let result = session
        .client
        .call_as::<ReflectLaunch>(Call::ReflectRun(ReflectParams {
            agent: args.agent.clone(),
            mode: args.mode.clone(),
            instruction: args.instruction.clone(),
            wait,
            context_window: window,
            isolation: args.isolation.clone(),
        }));
    session.close();
    let result = result.context("the reflection could not be started")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print_result(&result);
    }
    // Nothing new since the last reflection is an answer, not a failure: a
    // script that reflects after every session must not see an error.
    let ok = result.nothing_new()
        || result.launched
            && result
                .result
                .as_ref()
                .is_none_or(|r| r.status == "merged" || r.status == "no_changes");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What `reflect settings` was asked to change.
#[derive(Clone, Copy)]
struct SettingsChange<'a> {
    trigger: Option<&'a str>,
    step_count: Option<u32>,
    merge: Option<&'a str>,
    merge_instructions: Option<&'a str>,
}

/// `reflect settings`: show them, after applying `change`.
fn settings_command(
    home: &crate::paths::Home,
    agent: Option<&str>,
    change: &SettingsChange<'_>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let SettingsChange {
        trigger,
        step_count,
        merge,
        merge_instructions,
    } = *change;
    use crate::reflection::settings;
    let (_, paths) = crate::store::find(home, agent)?;
    let mut s = settings::load(&paths)?;
    let changing = trigger.is_some()
        || step_count.is_some()
        || merge.is_some()
        || merge_instructions.is_some();
    if let Some(text) = merge_instructions {
        s.merge_instructions = text.to_string();
    }
    if let Some(t) = trigger {
        s.trigger = t.parse()?;
    }
    if let Some(n) = step_count {
        s.step_count = n;
    }
    if let Some(m) = merge {
        s.merge = m.parse()?;
    }
    if changing {
        settings::save(&paths, &s)?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!(
            "trigger {}{}, merge {}",
            s.trigger.as_str(),
            if s.trigger == settings::Trigger::StepCount {
                format!(" (every {} steps)", s.step_count)
            } else {
                String::new()
            },
            s.merge.as_str()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A string of a supervisor answer shown as a field of stdout.
fn f(v: Option<&str>, default: &str) -> String {
    output::field(v.unwrap_or(default)).into_owned()
}

/// A string of a supervisor answer that is prose quoting data (a child's
/// message or summary): shown visibly.
fn t(v: &str) -> String {
    output::text(v).into_owned()
}

/// A stored time of a supervisor answer, in the one display format.
fn when(v: Option<&str>) -> String {
    match v {
        Some(s) => output::field(&output::display_stored_time(s)).into_owned(),
        None => "-".to_string(),
    }
}

/// A child id, or `-`.
fn id(child: Option<u64>) -> String {
    child.map_or_else(|| "-".into(), |c| c.to_string())
}

fn print_result(v: &ReflectLaunch) {
    let message = v.message.as_deref().unwrap_or("");
    if v.nothing_new() {
        println!("nothing to reflect on: {} (no_payload)", t(message));
        return;
    }
    if !v.launched {
        println!(
            "not launched ({}): {}",
            f(v.reason.map(|r| r.as_str()), "?"),
            t(message)
        );
        return;
    }
    match &v.result {
        Some(r) => {
            println!(
                "{} ({})",
                t(r.message.as_deref().unwrap_or("")),
                f(Some(&r.status), "?")
            );
            if !r.summary.is_empty() {
                println!("  {}", t(&r.summary));
            }
            // Why the sub-agent failed (e.g. its window was too small).
            if let Some(task) = &r.task
                && task.status == TaskStatus::Failed
                && let Some(report) = &task.report
            {
                println!("  {}", t(report));
            }
        }
        None => println!(
            "reflecting in the background (child {}, branch {})",
            id(v.child),
            f(v.branch.as_deref(), "?")
        ),
    }
}

/// A result's two parts: what merged and how the task ended.
fn parts(r: &SubagentResult) -> (String, String) {
    let merge = r.merge.as_ref().map_or("-", |m| m.status.as_str());
    let task = r.task.as_ref().map_or("-", |t| t.status.as_str());
    (merge.to_string(), task.to_string())
}

fn print_status(v: &ReflectStatus) {
    println!("agent:       {}", f(Some(&v.agent), "-"));
    println!(
        "trigger:     {} (every {} steps), merge {}",
        f(Some(&v.settings.trigger), "-"),
        v.settings.step_count,
        f(Some(&v.settings.merge), "-")
    );
    match &v.running {
        Some(r) if r.preparing => println!("running:     starting"),
        Some(r) => println!("running:     child {}", id(r.child)),
        None => println!("running:     no"),
    }
    match &v.lock {
        Some(l) => println!(
            "lock:        pid {} ({})",
            l.pid,
            if l.alive { "alive" } else { "stale" }
        ),
        None => println!("lock:        free"),
    }
    match &v.backoff {
        Some(b) => println!(
            "backoff:     {} ms, automatic launches wait until {}",
            b.delay_ms,
            when(Some(&b.retry_at))
        ),
        None => println!("backoff:     none"),
    }
    // Memory workers: the one running, those queued here, every
    // acknowledged instruction not applied yet, and those failing.
    let worker = match &v.worker {
        Some(w) if !w.preparing => format!("child {}", id(w.child)),
        Some(_) => "starting".to_string(),
        None => "none".to_string(),
    };
    println!(
        "workers:     running {worker}, {} waiting, {} kept until applied, {} failing, {} failed",
        v.workers_waiting, v.workers_kept, v.workers_failing, v.workers_failed
    );
    match &v.last {
        Some(l) => {
            println!(
                "last result: {} at {}: {}",
                f(Some(&l.status), "-"),
                when(l.finished_at.as_deref()),
                t(l.message.as_deref().unwrap_or(""))
            );
            // What merged and how the task ended, apart (older records:
            // merge only).
            let (merge, task) = parts(l);
            println!("             merge {merge}, task {task}");
        }
        None => println!("last result: none"),
    }
    if let Some(w) = &v.last_worker {
        let (merge, task) = parts(w);
        println!(
            "last worker: merge {merge}, task {task}, attempt {}, next: {}",
            w.attempt.unwrap_or(1),
            w.next.as_deref().unwrap_or("-")
        );
    }
    for row in v.workers.iter().filter(|r| r.status == "failed") {
        // Quoted: the instruction is the agent's text.
        println!(
            "failed:      {} after {} runs: {:?}",
            row.id, row.attempts, row.instruction
        );
    }
    for c in &v.conversations {
        println!(
            "conversation {}: {} steps since the last reflection, cursor {}",
            f(Some(&c.conversation), "?"),
            c.steps_since_last_reflection,
            f(c.reflected_through_message_id.as_deref(), "(none)")
        );
    }
}
