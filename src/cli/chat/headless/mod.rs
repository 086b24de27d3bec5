//! letta-code's headless mode on `mini-letta chat`: the flags its clients
//! pass (letta-ai's SDK starts the CLI with `--output-format stream-json
//! --input-format stream-json`), the one-shot `json`/`stream-json` output,
//! and the bidirectional session ([`stream`]). A face, not a second
//! runtime: every turn is [`super::turn::TurnRunner::run`], as `chat` runs it.
//! `docs/letta-code-sdk.md` says what is mapped, ignored or refused.

mod messages;
mod stream;
mod target;
pub(crate) mod wire;

use std::process::ExitCode;

use anyhow::bail;

use super::args::{ChatArgs, input_for, read_stdin_prompt};
use super::headless_args::HeadlessArgs;
use super::turn::{precheck, runner_for};
use crate::paths::{AgentPaths, Home};
use target::{Target, target};

/// Apply the reflection flags to the agent's settings (letta-code keeps
/// them per agent too).
fn apply_reflection(agent: &AgentPaths, h: &HeadlessArgs) -> anyhow::Result<()> {
    if h.reflection_trigger.is_none() && h.reflection_step_count.is_none() {
        return Ok(());
    }
    let mut s = crate::reflection::settings::load(agent)?;
    if let Some(t) = &h.reflection_trigger {
        s.trigger = t.parse()?;
    }
    if let Some(n) = h.reflection_step_count {
        s.step_count = n;
    }
    crate::reflection::settings::save(agent, &s)?;
    Ok(())
}

/// Run `chat` in letta-code's headless mode.
pub(crate) fn run(
    home: &Home,
    args: &ChatArgs,
    one_shot: Option<String>,
) -> anyhow::Result<ExitCode> {
    let h = &args.headless;
    let output = h.output_format.as_deref().unwrap_or("text");
    let bidirectional = h.input_format.as_deref() == Some("stream-json");
    if bidirectional && output != "stream-json" {
        bail!("--input-format stream-json needs --output-format stream-json");
    }
    if bidirectional && one_shot.is_some() {
        bail!("--input-format stream-json reads its messages from stdin: drop -p");
    }
    for n in h.notes() {
        eprintln!("mini-letta: note: {n}");
    }
    let t = target(home, args)?;
    apply_reflection(&t.agent, h)?;
    let model = args.model.clone().unwrap_or_else(|| t.record.model.clone());
    precheck(home, &t.agent, &model, &t.conversation)?;
    let settings = crate::reflection::settings::load(&t.agent).unwrap_or_default();
    let init = wire::Init {
        agent_id: &t.record.id,
        conversation_id: &t.conversation,
        model: &model,
        cwd: std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
        reflection_trigger: settings.trigger.as_str(),
        reflection_step_count: settings.step_count,
    };
    if bidirectional {
        return stream::serve(home, args, &t, &init);
    }
    let text = match one_shot {
        Some(t) => t,
        // letta-code reads the whole of stdin when no prompt is given.
        None => read_stdin_prompt()?,
    };
    one_shot_turn(home, args, &t, &init, output, &text)
}

/// `-p TEXT --output-format json|stream-json`: one turn, letta-code's shapes.
fn one_shot_turn(
    home: &Home,
    args: &ChatArgs,
    t: &Target,
    init: &wire::Init,
    output: &str,
    text: &str,
) -> anyhow::Result<ExitCode> {
    let streaming = output == "stream-json";
    let out = wire::Wire::new(Box::new(std::io::stdout()), &t.record.id);
    if streaming {
        out.send(init.line());
    }
    // Lines go to stdout only when streaming; json prints one document.
    let sink = if streaming {
        out.clone()
    } else {
        wire::Wire::new(Box::new(std::io::sink()), &t.record.id)
    };
    let mut lines = wire::TurnLines::new(sink, args.headless.include_partial_messages);
    let mut runner = runner_for(home, args, &t.record.id, &t.conversation)?;
    let input = input_for(args, &t.conversation, text, args.recompile, true)?;
    let done = runner.run(&input, &mut |e| lines.event(e));
    runner.close();
    let done = match done {
        Ok(d) => Some(d),
        Err(e) => {
            let message = crate::console::one_line(&e);
            if streaming {
                out.error(&message, "error");
            } else {
                eprintln!("Error: {message}");
            }
            None
        }
    };
    let result = lines.result(&t.record.id, &t.conversation, done.as_ref());
    let ok = result["subtype"] == "success";
    if streaming {
        out.send(result);
    } else {
        let mut doc = result;
        if let Some(o) = doc.as_object_mut() {
            o.remove("run_ids");
        }
        crate::console::output::json(&doc)?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
