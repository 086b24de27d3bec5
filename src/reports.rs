//! Reports on an agent for the operator that more than one front end shows
//! (the CLI and Palace), computed here once, above the agent program's
//! context rules and the home's configuration.
//!
//! The context figures of a conversation (`mini-letta context`, `agent
//! show`, Palace's conversation page): the window and its threshold, the tokens the
//! next request would start from (estimated as the turn loop does, with the
//! conversation's cached system prompt and the tools a request in its
//! window carries, each with its cost), the messages in context and stored,
//! and the last compaction.

use serde::Serialize;

use crate::agent::context::ContextError;
pub use crate::agent::context::compact::CompactionEvent;
use crate::agent::context::estimate::{self, Estimate, is_summary};
use crate::agent::context::window::{self, ResolvedWindow, WindowError, WindowInputs};
use crate::agent::tools;
use crate::agent::tools::Schemas;
use crate::model::config::ConfigError;
use crate::paths::{AgentPaths, Home};
use crate::store::conversation::Conversation;
use crate::store::record::AgentRecord;
use crate::store::{prompt_cache, system_prompt_file};

/// What `mini-letta context --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct ContextReport {
    pub agent: String,
    pub name: String,
    pub conversation: String,
    /// Whether the conversation has been started.
    pub exists: bool,
    pub model: String,
    #[serde(flatten)]
    pub window: ResolvedWindow,
    /// The estimate of the context's tokens.
    pub tokens: u64,
    /// Whether the next request compacts first.
    pub over_threshold: bool,
    pub estimate: Estimate,
    /// The tools the next request carries, and what each costs.
    pub tools: Vec<ToolCost>,
    /// How much of their definitions it carries (`tools::schemas`).
    pub tool_schemas: Schemas,
    pub messages_in_context: usize,
    pub messages_stored: usize,
    /// Compaction summaries in the log (every compaction made one).
    pub compactions: usize,
    pub last_compaction: Option<CompactionEvent>,
}

/// One tool a request carries and the estimate of its schema.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCost {
    pub name: String,
    pub tokens: u64,
}

/// Where the operator's window comes from: `MINI_LETTA_CONTEXT_WINDOW`,
/// `MINI_LETTA_REFLECTION_CONTEXT_WINDOW` and the supervisor's
/// configuration (the conversation's and the agent's settings are read
/// here).
#[derive(Debug, Clone, Copy, Default)]
pub struct OperatorWindow {
    pub environment: Option<u64>,
    pub reflection: Option<u64>,
    /// `config.toml`'s `[reflection] context_window`.
    pub reflection_config: Option<u64>,
    pub provider: Option<u64>,
}

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Window(#[from] WindowError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Context(#[from] ContextError),
}

/// The context figures of `conversation`, with the operator's environment
/// and configuration.
pub(crate) fn context_report(
    home: &Home,
    record: &AgentRecord,
    paths: &AgentPaths,
    conversation: &str,
) -> Result<ContextReport, ReportError> {
    let (environment, reflection) = window::env_windows()?;
    let cfg = crate::model::ProviderConfig::load(home)?;
    let operator = OperatorWindow {
        environment,
        reflection,
        reflection_config: cfg.reflection_context_window,
        provider: cfg.context_window_for(&record.model),
    };
    Ok(report(paths, record, conversation, operator)?)
}

/// The figures of `conversation` of an agent (nothing is created).
pub fn report(
    agent: &AgentPaths,
    record: &AgentRecord,
    conversation: &str,
    operator: OperatorWindow,
) -> Result<ContextReport, ContextError> {
    let conv = Conversation::open_existing(agent, conversation)?;
    let stored_window = match &conv {
        Some(c) => c.settings()?.context_window_limit,
        None => None,
    };
    let window = ResolvedWindow::resolve(
        &WindowInputs {
            option: None,
            environment: operator.environment,
            conversation: stored_window,
            agent: window::agent_window(&record.model_settings),
            reflection: operator.reflection,
            reflection_config: operator.reflection_config,
        },
        || operator.provider,
    );
    let system = match system_prompt_file::load(agent, conversation).ok().flatten() {
        Some(c) => c.content,
        None => prompt_cache::compile_now(agent, record, conversation, 0)?.content,
    };
    // What a turn in this window carries.
    let tools = tools::specs_for(window.context_window);
    let (estimate, in_context, stored, compactions, last) = match &conv {
        Some(c) => {
            let context = c.context()?;
            let last = c
                .compaction_event_bytes()?
                .and_then(|b| serde_json::from_slice::<CompactionEvent>(&b).ok());
            (
                estimate::context_estimate(&context, &system, &tools),
                context.len(),
                c.messages().len(),
                c.messages().iter().filter(|m| is_summary(m)).count(),
                last,
            )
        }
        None => (
            estimate::context_estimate(&[], &system, &tools),
            0,
            0,
            0,
            None,
        ),
    };
    Ok(ContextReport {
        agent: record.id.clone(),
        name: record.name.clone(),
        conversation: conversation.to_string(),
        exists: conv.is_some(),
        model: record.model.clone(),
        over_threshold: window.over(estimate.tokens),
        window,
        tokens: estimate.tokens,
        estimate,
        tool_schemas: Schemas::for_window(window.context_window),
        tools: tools
            .iter()
            .map(|t| ToolCost {
                name: t.name.clone(),
                tokens: estimate::tools_tokens(std::slice::from_ref(t)),
            })
            .collect(),
        messages_in_context: in_context,
        messages_stored: stored,
        compactions,
        last_compaction: last,
    })
}
