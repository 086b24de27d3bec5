//! letta-code's headless mode on `mini-letta chat`: the flags its clients
//! pass (letta-ai's SDK starts the CLI with `--output-format stream-json
//! --input-format stream-json`), the one-shot `json`/`stream-json` output,
//! and the bidirectional session ([`stream`]). A face, not a second
//! runtime: every turn is [`super::TurnRunner::run`], as `chat` runs it.
//! `docs/letta-code-sdk.md` says what is mapped, ignored or refused.

mod messages;
mod stream;
pub(crate) mod wire;

use std::process::ExitCode;

use anyhow::bail;
use clap::Args;

use super::ChatArgs;
use crate::paths::{AgentPaths, Home};
use crate::store;
use crate::store::record::AgentRecord;

/// letta-code's headless flags.
#[derive(Debug, Args, Default)]
#[command(next_help_heading = "letta-code headless mode")]
pub struct HeadlessArgs {
    /// text (the reply), json (one letta-code result document) or
    /// stream-json (letta-code's JSON lines: init, messages, result).
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "json", "stream-json"])]
    pub(crate) output_format: Option<String>,
    /// text, or stream-json: one process serves many turns, reading
    /// letta-code's `user` messages and control requests from stdin (needs
    /// --output-format stream-json).
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "stream-json"])]
    pub(crate) input_format: Option<String>,
    /// Create a new agent for this session (its id is in the init line).
    #[arg(long, conflicts_with = "agent")]
    pub(crate) new_agent: bool,
    /// Start a new conversation (`conv-…`) instead of the default one.
    #[arg(long)]
    pub(crate) new: bool,
    /// With stream-json: every chunk of the reply as a `stream_event` line
    /// (letta-code's partial messages) instead of whole messages.
    #[arg(long)]
    pub(crate) include_partial_messages: bool,
    /// With --new-agent: a block's value, LABEL=TEXT (persona, human).
    #[arg(long, value_name = "LABEL=TEXT", allow_hyphen_values = true)]
    pub(crate) block_value: Vec<String>,
    /// When reflection runs: off, step-count or compaction-event (kept as
    /// the agent's setting).
    #[arg(long, value_name = "WHEN", value_parser = ["off", "step-count", "compaction-event"])]
    pub(crate) reflection_trigger: Option<String>,
    /// Steps between reflections with --reflection-trigger step-count (kept
    /// as the agent's setting).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) reflection_step_count: Option<u32>,
    /// Accepted for letta-code's clients; memory is always a git repository.
    #[arg(long, hide = true)]
    memfs: bool,
    #[arg(long = "no-memfs", hide = true)]
    no_memfs: bool,
    #[arg(long, hide = true, value_name = "MODE")]
    memfs_startup: Option<String>,
    #[arg(long = "no-skills", hide = true)]
    no_skills: bool,
    #[arg(long, hide = true, value_name = "LIST")]
    skill_sources: Option<String>,
    #[arg(long = "no-system-info-reminder", hide = true)]
    no_system_info_reminder: bool,
    #[arg(long, hide = true, value_name = "B")]
    reflection_behavior: Option<String>,
    #[arg(long, hide = true, value_name = "PRESET")]
    system: Option<String>,
    #[arg(long, hide = true, value_name = "TEXT", allow_hyphen_values = true)]
    system_custom: Option<String>,
    #[arg(long, hide = true, value_name = "TEXT", allow_hyphen_values = true)]
    system_append: Option<String>,
    #[arg(long, hide = true, value_name = "LIST")]
    init_blocks: Option<String>,
    #[arg(long, hide = true, value_name = "JSON", allow_hyphen_values = true)]
    memory_blocks: Option<String>,
    #[arg(long, hide = true)]
    yolo: bool,
    #[arg(long, hide = true, value_name = "MODE")]
    permission_mode: Option<String>,
    #[arg(long = "allowedTools", hide = true, value_name = "LIST")]
    allowed_tools: Option<String>,
    #[arg(long = "disallowedTools", hide = true, value_name = "LIST")]
    disallowed_tools: Option<String>,
    #[arg(long, hide = true, value_name = "LIST")]
    tags: Option<String>,
    #[arg(long, hide = true, value_name = "MODEL")]
    embedding: Option<String>,
}

impl HeadlessArgs {
    /// Whether a letta-code output or input format was asked for.
    pub(crate) fn asked(&self) -> bool {
        self.output_format.as_deref().is_some_and(|f| f != "text")
            || self.input_format.as_deref() == Some("stream-json")
            || self.new_agent
            || self.new
    }

    /// One note on stderr per flag accepted for letta-code's clients and
    /// not applied here (never a failure).
    fn notes(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut note = |flag: &str, why: &str| v.push(format!("{flag}: {why}"));
        if self.no_memfs {
            note(
                "--no-memfs",
                "ignored: memory is always a git repository of Markdown files",
            );
        }
        if self.memfs_startup.is_some() {
            note(
                "--memfs-startup",
                "ignored: the supervisor owns the memory repository",
            );
        }
        if self.no_skills || self.skill_sources.is_some() {
            note(
                "--no-skills/--skill-sources",
                "ignored: skills come from the agent's memory",
            );
        }
        if self.no_system_info_reminder {
            note("--no-system-info-reminder", "ignored");
        }
        if self.reflection_behavior.is_some() {
            note(
                "--reflection-behavior",
                "ignored: reflections always run as sub-agents",
            );
        }
        if self.system.is_some() || self.system_custom.is_some() || self.system_append.is_some() {
            note(
                "--system/--system-custom/--system-append",
                "ignored: the system prompt is compiled from memory (agent create --system-file sets its base)",
            );
        }
        if self.init_blocks.is_some() || self.memory_blocks.is_some() {
            note(
                "--init-blocks/--memory-blocks",
                "ignored: a new agent gets the standard blocks",
            );
        }
        if self.yolo || self.permission_mode.is_some() {
            note(
                "--yolo/--permission-mode",
                "ignored: every tool runs confined, nothing asks for approval",
            );
        }
        if self.allowed_tools.is_some() || self.disallowed_tools.is_some() {
            note(
                "--allowedTools/--disallowedTools",
                "ignored: the tool set is the agent program's",
            );
        }
        if self.tags.is_some() || self.embedding.is_some() {
            note("--tags/--embedding", "ignored");
        }
        v
    }
}

/// The agent and conversation a headless session works on.
pub(crate) struct Target {
    pub record: AgentRecord,
    pub agent: AgentPaths,
    pub conversation: String,
}

/// Which agent and conversation the flags name, as letta-code decides:
/// `--conversation conv-…` alone finds its agent, `--conversation agent-…`
/// is that agent's default conversation, `--new` a new `conv-…`,
/// `--new-agent` a new agent. An unknown agent or conversation is an error
/// at once (the SDK reports it as the session's failure to start).
fn target(home: &Home, args: &ChatArgs) -> anyhow::Result<Target> {
    let h = &args.headless;
    let mut selector = args.agent.clone();
    let mut conversation = args.conversation.clone();
    if conversation.starts_with("agent-") {
        if selector.is_some() {
            bail!(
                "--conversation {conversation} names an agent; with --agent, name a conversation"
            );
        }
        selector = Some(std::mem::replace(&mut conversation, "default".into()));
    }
    if h.new && conversation != "default" {
        bail!("--new starts a new conversation; it cannot be combined with --conversation");
    }
    let (record, agent) = if h.new_agent {
        new_agent(home, args)?
    } else if selector.is_none() && conversation != "default" {
        owner_of(home, &conversation)?
    } else {
        match store::find(home, selector.as_deref()) {
            Ok(found) => found,
            Err(store::StoreError::NotFound(s)) => bail!("Agent {s} not found"),
            Err(e) => return Err(e.into()),
        }
    };
    if conversation != "default" && !h.new {
        let known = store::conversation::list_ids(&agent)?;
        if !known.contains(&conversation) {
            bail!("Conversation {conversation} not found");
        }
    }
    if h.new {
        conversation = store::new_prefixed_id("conv");
    }
    Ok(Target {
        record,
        agent,
        conversation,
    })
}

/// The agent that has conversation `id`.
fn owner_of(home: &Home, id: &str) -> anyhow::Result<(AgentRecord, AgentPaths)> {
    for record in store::list(home)? {
        let Ok((record, agent)) = store::find(home, Some(&record.id)) else {
            continue;
        };
        if store::conversation::list_ids(&agent).is_ok_and(|ids| ids.iter().any(|c| c == id)) {
            return Ok((record, agent));
        }
    }
    bail!("Conversation {id} not found")
}

/// `--new-agent`: an agent made as `agent create` makes one (named after
/// its id), with the model asked for and the blocks given.
fn new_agent(home: &Home, args: &ChatArgs) -> anyhow::Result<(AgentRecord, AgentPaths)> {
    let name = format!("sdk-{}", &store::new_prefixed_id("x")[2..10]);
    let record = crate::cli::agent_make::create_record(home, &name, args.model.as_deref())?;
    let (record, agent) = store::find(home, Some(&record.id))?;
    for bv in &args.headless.block_value {
        let Some((label, text)) = bv.split_once('=') else {
            bail!("--block-value {bv:?}: expected LABEL=TEXT");
        };
        crate::cli::memory::set_block(home, &record, label, text)?;
    }
    Ok((record, agent))
}

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
    super::precheck(home, &t.agent, &model, &t.conversation)?;
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
        None => super::read_stdin_prompt()?,
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
    let mut runner = super::runner_for(home, args, &t.record.id, &t.conversation)?;
    let input = super::input_for(args, &t.conversation, text, args.recompile, true)?;
    let done = runner.run(&input, &mut |e| lines.event(e));
    runner.close();
    let done = match done {
        Ok(d) => Some(d),
        Err(e) => {
            let message = crate::cli::one_line(&e);
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
        crate::cli::output::json(&doc)?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
