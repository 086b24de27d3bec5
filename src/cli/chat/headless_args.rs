//! letta-code's headless flags on `mini-letta chat`: those applied, and
//! those accepted for its clients and only noted.

use clap::Args;

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
    pub(crate) fn notes(&self) -> Vec<String> {
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
