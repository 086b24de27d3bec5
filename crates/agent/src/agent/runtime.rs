//! The turn loop (spec agent-loop.md §2), run inside the confined `agent`
//! child. A step is one model request (made by the supervisor on our
//! behalf); tool calls run here, under our confinement; memory edits are
//! committed by the supervisor.
//!
//! Stop reasons: `end_turn`, `max_steps`, `error`, `cancelled` (and
//! `requires_approval` internally between a tool call and its result).
//! Transient provider errors are retried at most three times with backoff.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::context::fit::Fit;
use super::context::{ContextError, FRAME_OVERFLOW, MAX_OVERFLOW_RETRIES, TurnContext};
use super::tools::{self, ToolContext};
use crate::paths::AgentPaths;
use crate::protocol::client::{Client, ClientError};
use crate::protocol::messages::{
    Message, ModelFailure, ModelRequest, ModelResponse, Part, Purpose, Role, Usage,
};
use crate::protocol::turn::{TurnEvent, TurnInput};
use crate::retry::{Policy, Spent, Verdict};
use crate::store::conversation::{Conversation, ConversationError, Reminder, StoredMessage};
use crate::store::prompt_cache::{self, PromptError};
use crate::store::record::AgentRecord;

/// Steps per turn unless the input says otherwise.
pub const DEFAULT_MAX_STEPS: u32 = 20;
/// Retries of a transient model error (after the first attempt).
pub const MAX_RETRIES: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Conversation(#[from] ConversationError),
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error("supervisor channel: {0}")]
    Channel(#[from] ClientError),
    #[error(transparent)]
    Context(#[from] ContextError),
}

fn now() -> String {
    crate::clock::now_rfc3339()
}

/// Reminder text wrapped as the harness does.
pub(crate) fn wrap_reminder(text: &str) -> String {
    format!("<system-reminder>\n{}\n</system-reminder>", text.trim_end())
}

pub fn agent_info(record: &AgentRecord, agent: &AgentPaths, conversation: &str) -> String {
    format!(
        "Agent info:\n- Agent ID (also AGENT_ID): {}\n- Conversation ID (also CONVERSATION_ID): {}\n- Memory directory (also MEMORY_DIR): {}\n- Agent name: {}",
        record.id,
        conversation,
        agent.memory_dir().display(),
        record.name
    )
}

/// The result text of a tool call a dead turn left unanswered.
pub const DID_NOT_COMPLETE: &str = "Turn did not complete";
/// The same after an explicit cancel.
pub const INTERRUPTED: &str = "Interrupted by user";

/// Settle tool calls left without results by a turn that died. The stored
/// log decides, not the context: a crash between appending the assistant's
/// calls and updating `context.json` must not leave them half-recorded.
fn settle_dangling(conv: &mut Conversation, text: &str) -> Result<(), RuntimeError> {
    let Some(last) = conv.messages().last() else {
        return Ok(());
    };
    if last.role != Role::Assistant {
        return Ok(());
    }
    let last_id = last.id.clone();
    let calls: Vec<(String, String)> = last
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall { id, name, .. } => Some((id.clone(), name.clone())),
            _ => None,
        })
        .collect();
    if calls.is_empty() {
        return Ok(());
    }
    let mut ids = conv.context_ids()?;
    if !ids.contains(&last_id) {
        ids.push(last_id);
        conv.set_context_ids(&ids)?;
    }
    let id = conv.next_id();
    let results = calls
        .into_iter()
        .map(|(call_id, name)| Part::ToolResult {
            call_id,
            name,
            text: text.into(),
            is_error: true,
        })
        .collect();
    conv.append(StoredMessage::new(id, Role::Tool, results))?;
    Ok(())
}

/// Run one turn. `emit` sees every event.
pub fn run_turn(
    agent: &AgentPaths,
    record: &AgentRecord,
    input: &TurnInput,
    channel: Arc<Mutex<Client>>,
    emit: &mut dyn FnMut(&TurnEvent),
) -> Result<TurnEvent, RuntimeError> {
    let mut conv = Conversation::open(agent, &input.conversation)?;
    settle_dangling(&mut conv, DID_NOT_COMPLETE)?;
    crate::protocol::timings::mark("agent.conversation_open");
    let head_at_start = memory_head(agent);
    let model = input.model.clone().unwrap_or_else(|| record.model.clone());
    // Context accounting and compaction (agent::context).
    let window = TurnContext::open(agent, record, input, &model, &conv, channel.clone())?;
    crate::protocol::timings::mark("agent.context_open");
    if input.compact.is_some() {
        return Ok(window.manual(&mut conv, input.compact.as_deref(), emit)?);
    }
    let user_id = append_user_message(agent, record, input, &mut conv, emit)?;
    crate::protocol::timings::mark("agent.user_logged");
    let mut turn = Turn {
        tools: tool_context(agent, record, input, &channel),
        agent,
        record,
        input,
        channel,
        model,
        window,
        conv,
        user_id,
        usage: Usage::default(),
        last_text: String::new(),
        recompile: input.recompile,
        step: 0,
    };
    let max_steps = input.max_steps.unwrap_or(DEFAULT_MAX_STEPS).max(1);
    let stop = loop {
        if turn.step >= max_steps {
            break "max_steps";
        }
        turn.step += 1;
        emit(&TurnEvent::Step { n: turn.step });
        if let Some(stop) = turn.run_step(emit)? {
            break stop;
        }
    };
    after_turn(agent, &turn.conv, head_at_start.as_deref());
    crate::protocol::timings::mark("agent.after_turn");
    let done = TurnEvent::Done {
        stop_reason: stop.to_string(),
        text: turn.last_text,
        steps: turn.step,
        usage: turn.usage,
    };
    emit(&done);
    Ok(done)
}

/// The user's message, reminders in front of the user's text as parts of
/// the same message; returns its id.
fn append_user_message(
    agent: &AgentPaths,
    record: &AgentRecord,
    input: &TurnInput,
    conv: &mut Conversation,
    emit: &mut dyn FnMut(&TurnEvent),
) -> Result<String, RuntimeError> {
    let mut reminders: Vec<Reminder> = Vec::new();
    if input.new_session {
        reminders.push(Reminder {
            id: "agent-info".into(),
            text: agent_info(record, agent, &input.conversation),
        });
    }
    reminders.extend(conv.pending_reminders()?);
    emit(&TurnEvent::Reminders {
        items: reminders.iter().map(|r| r.id.clone()).collect(),
    });
    let mut parts: Vec<Part> = reminders
        .iter()
        .map(|r| Part::Text {
            text: wrap_reminder(&r.text),
        })
        .collect();
    parts.push(Part::Text {
        text: input.text.clone(),
    });
    let user_id = conv.next_id();
    // Flushed with the turn's answer (or its error): one flush a turn.
    conv.append_unflushed(StoredMessage::new(user_id.clone(), Role::User, parts))?;
    conv.clear_pending_reminders()?;
    Ok(user_id)
}

/// What the turn's tools run with: the agent's own checkout, writable.
fn tool_context(
    agent: &AgentPaths,
    record: &AgentRecord,
    input: &TurnInput,
    channel: &Arc<Mutex<Client>>,
) -> ToolContext {
    ToolContext {
        agent: agent.clone(),
        agent_id: record.id.clone(),
        conversation_id: input.conversation.clone(),
        workspace: input.workspace.as_ref().map(std::path::PathBuf::from),
        channel: channel.clone(),
        worktree: None,
        read_only: false,
        read_roots: Vec::new(),
    }
}

/// What the steps of one turn share.
struct Turn<'a> {
    agent: &'a AgentPaths,
    record: &'a AgentRecord,
    input: &'a TurnInput,
    channel: Arc<Mutex<Client>>,
    model: String,
    window: TurnContext<'a>,
    conv: Conversation,
    tools: ToolContext,
    /// The message this turn answers.
    user_id: String,
    usage: Usage,
    last_text: String,
    /// Recompile the system prompt (only the first step's request asks).
    recompile: bool,
    step: u32,
}

impl Turn<'_> {
    /// One step: a request, the model's answer, the tools it calls.
    /// `Some` is the turn's stop reason.
    fn run_step(
        &mut self,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> Result<Option<&'static str>, RuntimeError> {
        let request = self.build_request(emit)?;
        crate::protocol::timings::mark("agent.request_built");
        let (request, response) = self.ask_model(request, emit);
        crate::protocol::timings::mark("agent.model_answered");
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                self.record_failure(&e, emit)?;
                return Ok(Some("error"));
            }
        };
        let calls = self.record_response(&response, &request, emit)?;
        crate::protocol::timings::mark("agent.response_logged");
        if calls.is_empty() {
            return Ok(Some("end_turn"));
        }
        self.run_tools(calls, &request, emit)?;
        Ok(None)
    }

    /// The step's request: the prompt (with the skills and any memory
    /// notices stored first), the context, the tools the window allows.
    fn build_request(
        &mut self,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> Result<ModelRequest, RuntimeError> {
        let (agent, conv) = (self.agent, &mut self.conv);
        let context_len = conv.context()?.len() as u64;
        let prompt = prompt_cache::resolve(
            agent,
            self.record,
            &self.input.conversation,
            context_len,
            self.recompile,
        )?;
        self.recompile = false;
        // Skills are offered per request, outside the cached prompt.
        let system = super::skills::append_block(
            &prompt.system,
            &super::skills::discover(&agent.memory_dir()),
        );
        if let Some(notice) = prompt.notice.as_ref().filter(|_| self.step == 1) {
            emit(&TurnEvent::Reminders {
                items: vec!["memory-revision-invalid".into()],
            });
            append_reminder(conv, "reminder", notice)?;
        }
        if let Some(update) = &prompt.memory_update {
            emit(&TurnEvent::MemoryUpdate {
                revision: update.revision.clone(),
            });
            // Stored, so every later request carries it (none sees the
            // stale memory again) and none generates it twice.
            append_reminder(conv, "memory_update", &update.text)?;
        }
        let messages: Vec<Message> = conv.context()?.iter().map(|m| m.to_message()).collect();
        Ok(ModelRequest {
            model: self.model.clone(),
            system,
            messages,
            // Fewer and shorter as the window shrinks (tools::schemas).
            tools: tools::specs_for(self.window.window.context_window),
            max_tokens: None,
            purpose: Purpose::Turn,
            context_window: None,
        })
    }

    /// Send the request, fitted to the window, and again smaller while the
    /// provider says it does not fit; returns the request last sent and
    /// the answer (an empty answer is a failure).
    fn ask_model(
        &mut self,
        request: ModelRequest,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> (ModelRequest, Result<ModelResponse, ModelFailure>) {
        let (agent, conv, window) = (self.agent, &mut self.conv, &self.window);
        // Over the threshold: compacted first (the request rebuilt); over
        // the whole window: compacted harder, tool results trimmed.
        let mut fit = Fit::default();
        let mut request = window.preflight(conv, request, &mut fit, emit);
        // What the model was sent, for operators (and tests).
        let _ = conv.write_last_request(agent, &request);
        crate::protocol::timings::mark("agent.model_asked");
        let mut response = complete_with_retries(&self.channel, &request, emit);
        // The provider said it does not fit: the next rung, and again.
        for _ in 0..MAX_OVERFLOW_RETRIES {
            if !matches!(response, Err(ModelFailure::ContextOverflow { .. })) {
                break;
            }
            let Some(retry) = window.after_overflow(conv, &request, &mut fit, emit) else {
                break;
            };
            request = retry;
            let _ = conv.write_last_request(agent, &request);
            response = complete_with_retries(&self.channel, &request, emit);
        }
        let response = match response {
            Ok(r) if r.parts.is_empty() => Err(ModelFailure::fatal(
                "the model returned an empty response (no text, no tool call)",
            )),
            Err(e @ ModelFailure::ContextOverflow { .. }) => Err(window.does_not_fit(&request, e)),
            other => other,
        };
        (request, response)
    }

    /// A failed step: kept for the record, never shown to the model as its
    /// own answer; a user message nothing answered leaves the context too,
    /// so asking again does not send it twice.
    fn record_failure(
        &mut self,
        e: &ModelFailure,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> Result<(), RuntimeError> {
        let id = self.conv.next_id();
        self.conv.append_outside_context(StoredMessage {
            id,
            role: Role::Assistant,
            parts: vec![Part::Text {
                text: format!("[error] {}", described(e)),
            }],
            kind: Some("error".into()),
            usage: None,
            stop: Some("error".into()),
            model: Some(self.model.clone()),
            ts: now(),
        })?;
        if self.step == 1 {
            self.conv.remove_from_context(&self.user_id)?;
        }
        emit(&TurnEvent::Error {
            message: described(e),
            hint: hint_for(e),
        });
        self.last_text = format!("error: {}", described(e));
        Ok(())
    }

    /// The model's answer, stored (compacted after, if over the
    /// threshold); returns the tool calls it makes.
    fn record_response(
        &mut self,
        response: &ModelResponse,
        request: &ModelRequest,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> Result<Vec<(String, String, serde_json::Value)>, RuntimeError> {
        self.usage.input_tokens += response.usage.input_tokens;
        self.usage.output_tokens += response.usage.output_tokens;
        let calls = response.tool_calls();
        let text = response.text();
        if !text.is_empty() {
            self.last_text = text;
        }
        let id = self.conv.next_id();
        self.conv.append(StoredMessage {
            id,
            role: Role::Assistant,
            parts: response.parts.clone(),
            kind: None,
            usage: Some(response.usage),
            stop: Some(
                if calls.is_empty() {
                    "end_turn"
                } else {
                    "requires_approval"
                }
                .into(),
            ),
            model: Some(response.model.clone()),
            ts: now(),
        })?;
        self.window.after_response(&mut self.conv, request, emit);
        Ok(calls)
    }

    /// Run the calls (only what the request offered) and store their
    /// results as one tool message.
    fn run_tools(
        &mut self,
        calls: Vec<(String, String, serde_json::Value)>,
        request: &ModelRequest,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> Result<(), RuntimeError> {
        let mut results = Vec::new();
        for (call_id, name, arguments) in calls {
            emit(&TurnEvent::ToolCall {
                id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            });
            // Only what the request offered runs (a small window offers
            // fewer tools; a model may name another).
            let out = if request.tools.iter().any(|t| t.name == name) {
                tools::execute(&self.tools, &name, &arguments)
            } else {
                tools::not_offered(&name, &request.tools, request.context_window)
            };
            emit(&TurnEvent::ToolResult {
                id: call_id.clone(),
                name: name.clone(),
                text: out.text.clone(),
                is_error: out.is_error,
            });
            results.push(Part::ToolResult {
                call_id,
                name,
                text: out.text,
                is_error: out.is_error,
            });
        }
        let id = self.conv.next_id();
        self.conv
            .append(StoredMessage::new(id, Role::Tool, results))?;
        Ok(())
    }
}

/// Store a harness reminder as a user message of its own (`kind` says
/// which): the user role and `<system-reminder>` wrapping, never a system
/// message, never an edit of an earlier message.
fn append_reminder(conv: &mut Conversation, kind: &str, text: &str) -> Result<(), RuntimeError> {
    let id = conv.next_id();
    let mut message = StoredMessage::new(
        id,
        Role::User,
        vec![Part::Text {
            text: wrap_reminder(text),
        }],
    );
    message.kind = Some(kind.into());
    conv.append(message)?;
    Ok(())
}

/// How a retried failure ends its message (see [`gave_up`]).
const GAVE_UP: &str = "(gave up after ";

/// A failure as the person reads it: "transient" only while it is being
/// retried — once given up on, it is a model error like any other.
fn described(e: &ModelFailure) -> String {
    match e {
        ModelFailure::Transient {
            status, message, ..
        } if message.contains(GAVE_UP) => format!(
            "model error{}: {message}",
            status.map(|s| format!(" (HTTP {s})")).unwrap_or_default()
        ),
        _ => e.to_string(),
    }
}

/// What to do about a model failure, when the message alone does not say.
fn hint_for(e: &ModelFailure) -> Option<String> {
    match e {
        ModelFailure::Transient { hint: Some(h), .. } => Some(h.clone()),
        ModelFailure::Transient { status: Some(_), .. } => {
            Some("the provider may be overloaded; try again shortly".into())
        }
        ModelFailure::Transient { .. } => Some(
            "the provider could not be reached or stopped answering; try again shortly".into(),
        ),
        ModelFailure::ContextOverflow { message } if message.starts_with(FRAME_OVERFLOW) => Some(
            "send a shorter message: a larger context window cannot carry it".into(),
        ),
        ModelFailure::ContextOverflow { .. } => Some(
            "nothing more could be compacted, trimmed or shortened; send a shorter message, start a new conversation (`chat --new`), give the conversation a larger window (`chat --context-window N`, `agent create --context-window N`), or shorten the system prompt by trimming a memory block (`mini-letta memory tree` lists them; `memory replace` edits one)".into(),
        ),
        ModelFailure::Fatal { status: Some(401 | 403), .. } => Some(
            "check the provider's API key (OPENAI_API_KEY / ANTHROPIC_API_KEY, or api_key in config.toml)".into(),
        ),
        ModelFailure::Fatal { .. } => None,
    }
}

/// Record that a turn was cancelled (its child stopped): calls it left
/// unanswered get `Interrupted by user` results, and the conversation
/// shows the interruption. Run by the supervisor once the child is gone,
/// while it still holds the conversation's turn slot (so it is the only
/// writer).
pub fn record_interruption(agent: &AgentPaths, conversation: &str) -> Result<(), RuntimeError> {
    let mut conv = Conversation::open(agent, conversation)?;
    let answered = conv
        .messages()
        .last()
        .is_some_and(|m| m.role == Role::Assistant && m.stop.as_deref() == Some("end_turn"));
    if answered {
        return Ok(());
    }
    settle_dangling(&mut conv, INTERRUPTED)?;
    let id = conv.next_id();
    conv.append(StoredMessage {
        id,
        role: Role::Assistant,
        parts: vec![Part::Text {
            text: format!("[{INTERRUPTED}]"),
        }],
        kind: Some("interrupted".into()),
        usage: None,
        stop: Some("cancelled".into()),
        model: None,
        ts: now(),
    })?;
    Ok(())
}

/// The memory repository's HEAD commit, if any.
fn memory_head(agent: &AgentPaths) -> Option<String> {
    let repo = crate::memfs::repo::open_agent(agent).ok()?;
    let head = repo.head().ok()?.target()?;
    Some(head.to_string())
}

/// After a turn, reminders for the next one: uncommitted memory edits
/// (`MEMORY COMMIT NEEDED`), and index links the turn's commits left
/// dangling (checked only when HEAD moved, so one broken link is said once).
fn after_turn(agent: &AgentPaths, conv: &Conversation, head_at_start: Option<&str>) {
    let Ok(repo) = crate::memfs::repo::open_agent(agent) else {
        return;
    };
    let mut opts = git2::StatusOptions::new();
    opts.include_untracked(true).recurse_untracked_dirs(true);
    if let Ok(statuses) = repo.statuses(Some(&mut opts)) {
        let n = statuses
            .iter()
            .filter(|s| s.path().map(|p| p != ".git").unwrap_or(true))
            .count();
        if n > 0 {
            let text = super::reminders::commit_needed(
                &agent.memory_dir(),
                &format!("{n} uncommitted memory change(s)."),
                "",
            );
            let _ = conv.queue_reminder("memory-commit-needed", &text);
        }
    }
    let head_now = repo
        .head()
        .ok()
        .and_then(|h| h.target())
        .map(|o| o.to_string());
    if head_now.is_none() || head_now.as_deref() == head_at_start {
        return;
    }
    if let Ok(broken) = crate::memfs::links::broken_index_links(&repo)
        && !broken.is_empty()
    {
        let _ = conv.queue_reminder("memory-links-broken", &broken_links_text(agent, &broken));
    }
}

/// The reminder naming index links that lead nowhere.
pub fn broken_links_text(agent: &AgentPaths, broken: &[crate::memfs::links::BrokenLink]) -> String {
    let lines: Vec<String> = broken
        .iter()
        .map(|b| format!("- {}: ({}) does not exist", b.index, b.target))
        .collect();
    format!(
        "MEMORY LINKS BROKEN: {} link(s) in your memory indexes point to files that are not in the committed memory.\n\nMemory directory: {}\n{}\n\nFix each link, or restore or create the file it names, and commit: an index whose links lead nowhere hides memory from you.",
        broken.len(),
        agent.memory_dir().display(),
        lines.join("\n")
    )
}

/// How a transient model failure is retried: [`MAX_RETRIES`] times, after
/// 200, 400 and 800 ms, or after the pause the server asked for (at most a
/// minute).
const MODEL_RETRY: Policy = Policy::backoff(
    MAX_RETRIES + 1,
    Duration::from_millis(200),
    MODEL_RETRY_MAX_PAUSE,
);

/// The longest pause between model tries, whatever the server asks.
const MODEL_RETRY_MAX_PAUSE: Duration = Duration::from_secs(60);

/// Ask the supervisor for a completion, retrying transient failures.
fn complete_with_retries(
    channel: &Arc<Mutex<Client>>,
    request: &ModelRequest,
    emit: &mut dyn FnMut(&TurnEvent),
) -> Result<ModelResponse, ModelFailure> {
    // Both the tries (text deltas) and the verdicts (retry notes) emit.
    let emit = std::cell::RefCell::new(emit);
    let once = || {
        let mut client = channel.lock().unwrap_or_else(|p| p.into_inner());
        client.model_complete(request, |text| {
            (emit.borrow_mut())(&TurnEvent::TextDelta {
                text: text.to_string(),
            })
        })
    };
    let judge = |err: &ModelFailure, attempt| {
        let ModelFailure::Transient { retry_after_ms, .. } = err else {
            return Verdict::GiveUp;
        };
        // The pause the schedule will take, said before it is taken.
        let delay = retry_after_ms.map_or(MODEL_RETRY.pause(attempt), |ms| {
            Duration::from_millis(ms).min(MODEL_RETRY_MAX_PAUSE)
        });
        (emit.borrow_mut())(&TurnEvent::Retry {
            attempt,
            error: err.to_string(),
            delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        });
        retry_after_ms.map_or(Verdict::Retry, |ms| {
            Verdict::RetryAfter(Duration::from_millis(ms))
        })
    };
    MODEL_RETRY.run_with(once, judge).map_err(gave_up)
}

/// A retried failure that stayed: say how long it all took.
fn gave_up(spent: Spent<ModelFailure>) -> ModelFailure {
    match spent.error {
        ModelFailure::Transient {
            status,
            message,
            retry_after_ms,
            hint,
        } if spent.tries > 1 => ModelFailure::Transient {
            status,
            message: format!(
                "{message} {GAVE_UP}{} attempts in {:.1} s)",
                spent.tries,
                spent.elapsed.as_secs_f64()
            ),
            retry_after_ms,
            hint,
        },
        e => e,
    }
}

/// Events go out as NDJSON on stdout (the agent child's protocol with the
/// CLI that started it).
pub(crate) fn emit_json_line(event: &TurnEvent) {
    use std::io::Write;
    let line = json!(event).to_string();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
