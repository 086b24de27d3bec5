//! Context-window accounting and compaction (spec agent-loop.md §4–§5, book
//! ch. 11–12), and the hooks the turn loop calls.
//!
//! * [`window`] — the window a conversation's turns use, the threshold.
//! * [`estimate`] — how many tokens the context holds.
//! * [`plan`] — what a sliding-window or an all compaction summarises.
//! * [`transcript`] — what the summariser is sent; the summary message.
//! * [`compact`] — a compaction applied to a conversation.
//! * [`report`] — the figures `mini-letta context` and `agent show` print.
//!
//! In a turn ([`TurnContext`]): before each model request the context is
//! estimated (the request's own system prompt and tools when no usage
//! anchors it) and compacted above the threshold; after each response the
//! same with the response's usage; a provider's context-overflow error
//! compacts (`context_window_overflow`) and the request is retried.
//! Each compaction recompiles the system prompt (the prefix changed
//! anyway) and is reported as a [`TurnEvent::Compaction`]. A request still
//! over the whole window climbs [`fit`]'s ladder (compact `all`, trim old
//! tool results, trim the latest) before it is sent, and again after each
//! provider overflow; at the top, the error names the parts that do not
//! fit ([`TurnContext::does_not_fit`]).

pub mod compact;
pub mod estimate;
pub mod fit;
pub mod plan;
pub mod transcript;
pub mod window;

use std::sync::{Arc, Mutex};

use compact::{CompactError, Compacted, CompactionSettings, Mode, Summarizer, Trigger};
use fit::{Fit, Rung};
use window::{ResolvedWindow, WindowInputs};

use crate::paths::AgentPaths;
use crate::protocol::client::Client;
use crate::protocol::messages::{Message, ModelFailure, ModelRequest, Part, Purpose, Usage};
use crate::protocol::turn::{TurnEvent, TurnInput};
use crate::store::conversation::{Conversation, ConversationError};
use crate::store::prompt_cache::{self, PromptError};
use crate::store::record::AgentRecord;

/// Retries after provider overflow errors in one step: one per rung of
/// [`fit`]'s ladder at most (then the error stands).
pub const MAX_OVERFLOW_RETRIES: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error(transparent)]
    Conversation(#[from] ConversationError),
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error(transparent)]
    Compact(#[from] CompactError),
    #[error("unknown compaction mode {0:?} (all or sliding_window)")]
    Mode(String),
}

/// The summariser behind the supervisor's model proxy: the child's own
/// model, purpose `summary`, no tools, the turn's window.
pub struct ChannelSummarizer<'a> {
    pub channel: &'a Arc<Mutex<Client>>,
    pub model: &'a str,
    pub window: Option<u64>,
    /// What the summaries cost.
    pub usage: Usage,
}

impl Summarizer for ChannelSummarizer<'_> {
    fn summarize(&mut self, system: &str, transcript: &str) -> Result<String, ModelFailure> {
        let request = ModelRequest {
            model: self.model.to_string(),
            system: system.to_string(),
            messages: vec![Message::user(transcript)],
            tools: Vec::new(),
            max_tokens: None,
            purpose: Purpose::Summary,
            context_window: self.window,
        };
        let response = {
            let mut client = self.channel.lock().unwrap_or_else(|p| p.into_inner());
            client.model_complete(&request, |_| {})?
        };
        self.usage.input_tokens += response.usage.input_tokens;
        self.usage.output_tokens += response.usage.output_tokens;
        Ok(response
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } if !text.is_empty() => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"))
    }
}

/// The event a compaction is reported as.
/// How a turn's failure begins when its request is over the frame limit
/// (no window, however large, lets it through: the hint says so).
pub const FRAME_OVERFLOW: &str = "the request is larger than one request to the model may be";

/// Whether `request` fits one frame to the supervisor (issue 43 §5: one
/// that does not is refused there, however large the model's window).
fn fits_a_frame(request: &ModelRequest) -> bool {
    crate::protocol::encoded_len(request) <= crate::protocol::FRAME_PAYLOAD_BUDGET
}

pub(crate) fn compaction_event(c: &Compacted) -> TurnEvent {
    TurnEvent::Compaction {
        trigger: c.event.trigger.clone(),
        mode: c.event.mode.clone(),
        messages_before: c.event.messages_before,
        messages_after: c.event.messages_after,
        tokens_before: c.event.tokens_before,
        tokens_after: c.event.tokens_after,
    }
}

/// A turn's context accounting: its window and compaction settings, and
/// the hooks the turn loop calls.
pub struct TurnContext<'a> {
    agent: &'a AgentPaths,
    record: &'a AgentRecord,
    conversation: String,
    model: String,
    channel: Arc<Mutex<Client>>,
    pub window: ResolvedWindow,
    settings: CompactionSettings,
}

impl<'a> TurnContext<'a> {
    /// The turn's window: `chat --context-window` (stored as the
    /// conversation's from now on), `MINI_LETTA_CONTEXT_WINDOW`, the
    /// conversation's, the agent's, else the one the supervisor's
    /// configuration gives the child's model (asked only then).
    pub fn open(
        agent: &'a AgentPaths,
        record: &'a AgentRecord,
        input: &TurnInput,
        model: &str,
        conv: &Conversation,
        channel: Arc<Mutex<Client>>,
    ) -> Result<Self, ContextError> {
        let mut stored = conv.settings().unwrap_or_else(|e| {
            tracing::warn!("{e}; the conversation's settings are ignored");
            Default::default()
        });
        if let Some(w) = input.context_window.filter(|w| *w > 0)
            && stored.context_window_limit != Some(w)
        {
            stored.context_window_limit = Some(w);
            conv.set_settings(&stored)?;
        }
        let inputs = WindowInputs {
            option: input.context_window,
            environment: input.context_window_override,
            conversation: stored.context_window_limit,
            agent: window::agent_window(&record.model_settings),
            reflection: input.reflection_context_window,
            // The supervisor's configuration; a child does not read it.
            reflection_config: None,
        };
        let window = ResolvedWindow::resolve(&inputs, || {
            let mut client = channel.lock().unwrap_or_else(|p| p.into_inner());
            client.model_context_window(None).unwrap_or_else(|e| {
                tracing::debug!("model.info: {e}");
                None
            })
        });
        Ok(Self {
            agent,
            record,
            conversation: input.conversation.clone(),
            model: model.to_string(),
            channel,
            window,
            settings: record.compaction_settings.clone().unwrap_or_default(),
        })
    }

    /// The mode automatic compactions use.
    fn mode(&self) -> Mode {
        self.settings.mode.unwrap_or_default()
    }

    /// Compact `conv` now; reported, and the system prompt recompiled
    /// (the fresh prompt is returned).
    fn compact(
        &self,
        conv: &mut Conversation,
        trigger: Trigger,
        mode: Mode,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> Result<(Compacted, Option<String>, Usage), CompactError> {
        let mut summarizer = ChannelSummarizer {
            channel: &self.channel,
            model: &self.model,
            window: self.window.context_window,
            usage: Usage::default(),
        };
        let request = compact::Request {
            trigger,
            mode,
            window: self.window.context_window,
            settings: &self.settings,
        };
        let done = compact::compact(conv, &request, &mut summarizer)?;
        emit(&compaction_event(&done));
        Ok((done, self.recompile(conv), summarizer.usage))
    }

    /// Compile the system prompt afresh (and cache it): after a
    /// compaction, and when the context is over the threshold with nothing
    /// to compact (a fresh prompt holds the current memory, so the stored
    /// `<memory_update>`s leave the context).
    fn recompile(&self, conv: &Conversation) -> Option<String> {
        let count = conv.context().map(|c| c.len() as u64).unwrap_or(0);
        match prompt_cache::resolve(self.agent, self.record, &self.conversation, count, true) {
            Ok(p) => {
                // The fresh prompt holds the current memory: the stored
                // `<memory_update>`s still in context say nothing new
                // (they stay in the log).
                let updates: Vec<String> = conv
                    .context()
                    .map(|c| {
                        c.iter()
                            .filter(|m| m.kind.as_deref() == Some("memory_update"))
                            .map(|m| m.id.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                for id in updates {
                    if let Err(e) = conv.remove_from_context(&id) {
                        tracing::warn!("cannot drop a memory update from the context: {e}");
                    }
                }
                Some(p.system)
            }
            Err(e) => {
                tracing::warn!("cannot recompile the system prompt: {e}");
                None
            }
        }
    }

    /// An automatic compaction; `None` (and a log line) when none was made.
    fn compact_quietly(
        &self,
        conv: &mut Conversation,
        trigger: Trigger,
        mode: Mode,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> Option<Option<String>> {
        match self.compact(conv, trigger, mode, emit) {
            Ok((_, system, _)) => Some(system),
            Err(CompactError::Plan(e)) => {
                tracing::debug!("no {} compaction: {e}", trigger.as_str());
                None
            }
            Err(e) => {
                tracing::warn!("{} compaction failed: {e}", trigger.as_str());
                None
            }
        }
    }

    /// `request` again over the compacted context, with the recompiled
    /// system prompt.
    fn rebuild(
        &self,
        conv: &Conversation,
        request: ModelRequest,
        system: Option<String>,
    ) -> ModelRequest {
        let messages = match conv.context() {
            Ok(c) => c.iter().map(|m| m.to_message()).collect(),
            Err(e) => {
                tracing::warn!("cannot read the compacted context: {e}");
                return request;
            }
        };
        ModelRequest {
            system: system.unwrap_or(request.system),
            messages,
            ..request
        }
    }

    /// Before a model request: compact above the threshold, then, while
    /// the request is over the whole window, climb the ladder; return the
    /// request to send (with the turn's window, which the mock honours).
    pub(crate) fn preflight(
        &self,
        conv: &mut Conversation,
        mut request: ModelRequest,
        fit: &mut Fit,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> ModelRequest {
        request.context_window = self.window.context_window;
        let tokens = match conv.context() {
            Ok(c) => estimate::context_estimate(&c, &request.system, &request.tools).tokens,
            Err(_) => return request,
        };
        if self.window.over(tokens) {
            fit.compacted = true;
            request = self.compact_and_rebuild(
                conv,
                request,
                self.mode(),
                Trigger::ContextWindowLimit,
                emit,
            );
        }
        let window = self.window.context_window;
        // Over the whole window, or too large for one frame to the
        // supervisor (a window of millions of tokens, or none known).
        while window.is_some_and(|w| fit::parts(&request).total() > w) || !fits_a_frame(&request) {
            let Some(rung) = fit.climb() else { break };
            request = self.climb(conv, request, rung, Trigger::ContextWindowLimit, emit);
        }
        request
    }

    /// Compact in `mode` and rebuild `request` over the result (a fresh
    /// system prompt even when nothing could be compacted: it holds the
    /// current memory, so stored `<memory_update>`s leave the context).
    fn compact_and_rebuild(
        &self,
        conv: &mut Conversation,
        request: ModelRequest,
        mode: Mode,
        trigger: Trigger,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> ModelRequest {
        match self.compact_quietly(conv, trigger, mode, emit) {
            Some(system) => self.rebuild(conv, request, system),
            None => match self.recompile(conv) {
                Some(system) => self.rebuild(conv, request, Some(system)),
                None => request,
            },
        }
    }

    /// Apply one rung of the ladder to `request`.
    fn climb(
        &self,
        conv: &mut Conversation,
        mut request: ModelRequest,
        rung: Rung,
        trigger: Trigger,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> ModelRequest {
        match rung {
            Rung::Compact => self.compact_and_rebuild(conv, request, self.mode(), trigger, emit),
            Rung::CompactAll => self.compact_and_rebuild(conv, request, Mode::All, trigger, emit),
            Rung::TrimOld => {
                fit::trim_old(&mut request);
                request
            }
            Rung::TrimLatest => {
                let target = self.window.threshold.unwrap_or(0);
                fit::trim_latest(&mut request, target);
                request
            }
            Rung::ShortenSummary => self.shorten_summary(conv, request, trigger, emit),
        }
    }

    /// Rung 5: summarise the context's summary again within what the
    /// window leaves it, and rebuild `request` over the result.
    fn shorten_summary(
        &self,
        conv: &mut Conversation,
        request: ModelRequest,
        trigger: Trigger,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> ModelRequest {
        let Some(window) = self.window.context_window else {
            return request;
        };
        let Ok(context) = conv.context() else {
            return request;
        };
        let Some(summary) = context.first() else {
            return request;
        };
        let p = fit::parts(&request);
        let rest = p.messages.saturating_sub(estimate::message_tokens(summary));
        // What the window leaves the summary, with a tenth kept free for
        // the answer.
        let budget = window
            .saturating_sub(window / 10)
            .saturating_sub(p.system + p.tools + rest);
        let mut summarizer = ChannelSummarizer {
            channel: &self.channel,
            model: &self.model,
            window: self.window.context_window,
            usage: Usage::default(),
        };
        let req = compact::Request {
            trigger,
            mode: Mode::All,
            window: self.window.context_window,
            settings: &self.settings,
        };
        match compact::shorten_summary(conv, &req, budget, &mut summarizer) {
            Ok(done) => {
                emit(&compaction_event(&done));
                let system = self.recompile(conv);
                self.rebuild(conv, request, system)
            }
            Err(e) => {
                tracing::debug!("the summary was not shortened: {e}");
                request
            }
        }
    }

    /// After a response (appended to `conv`): compact above the threshold.
    /// Its usage anchors the estimate (without usage: `request`'s system
    /// prompt and tools with every message).
    pub(crate) fn after_response(
        &self,
        conv: &mut Conversation,
        request: &ModelRequest,
        emit: &mut dyn FnMut(&TurnEvent),
    ) {
        let tokens = match conv.context() {
            Ok(c) => estimate::context_estimate(&c, &request.system, &request.tools).tokens,
            Err(_) => return,
        };
        if self.window.over(tokens) {
            self.compact_quietly(conv, Trigger::ContextWindowLimit, self.mode(), emit);
        }
    }

    /// After a provider said `request` does not fit: the next rung of the
    /// ladder that changes the request, and the request to try again
    /// (`None`: every rung is climbed, the error stands).
    pub(crate) fn after_overflow(
        &self,
        conv: &mut Conversation,
        request: &ModelRequest,
        fit: &mut Fit,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> Option<ModelRequest> {
        while let Some(rung) = fit.climb() {
            let again = self.climb(
                conv,
                request.clone(),
                rung,
                Trigger::ContextWindowOverflow,
                emit,
            );
            // Worth a retry only when it changed.
            if again.system != request.system || again.messages != request.messages {
                return Some(again);
            }
        }
        None
    }

    /// The error of a request the provider refused after every rung: what
    /// it is made of against the window, then the provider's words.
    pub(crate) fn does_not_fit(
        &self,
        request: &ModelRequest,
        failure: ModelFailure,
    ) -> ModelFailure {
        let ModelFailure::ContextOverflow { message } = failure else {
            return failure;
        };
        let p = fit::parts(request);
        if !fits_a_frame(request) {
            return ModelFailure::ContextOverflow {
                message: format!(
                    "{FRAME_OVERFLOW} ({} MiB) even after compacting everything and trimming tool \
                     results: it is {} bytes, its messages {} tokens (estimated)",
                    crate::protocol::MAX_FRAME_BYTES / (1024 * 1024),
                    crate::protocol::encoded_len(request),
                    p.messages
                ),
            };
        }
        let window = match self.window.context_window {
            Some(w) => format!("the {w}-token context window"),
            None => "the model's context window".to_string(),
        };
        ModelFailure::ContextOverflow {
            message: format!(
                "the request does not fit {window} even after compacting everything and trimming tool results: \
                 system prompt {} + tools {} + messages {} = {} tokens (estimated); the provider said: {message}",
                p.system,
                p.tools,
                p.messages,
                p.total()
            ),
        }
    }

    /// `mini-letta compact`: compact now in `mode` (the agent's unless
    /// given); the turn's `done` says what happened.
    pub fn manual(
        &self,
        conv: &mut Conversation,
        mode: Option<&str>,
        emit: &mut dyn FnMut(&TurnEvent),
    ) -> Result<TurnEvent, ContextError> {
        let mode = match mode {
            Some(m) => Mode::parse(m).ok_or_else(|| ContextError::Mode(m.to_string()))?,
            None => self.mode(),
        };
        let (stop, text, usage) = match self.compact(conv, Trigger::Manual, mode, emit) {
            Ok((done, _, usage)) => (
                "end_turn",
                format!(
                    "compacted ({}): {} → {} messages in context, about {} → {} tokens of messages",
                    done.event.mode,
                    done.event.messages_before,
                    done.event.messages_after,
                    done.event.tokens_before,
                    done.event.tokens_after
                ),
                usage,
            ),
            Err(CompactError::Plan(e)) => ("end_turn", e.to_string(), Usage::default()),
            Err(e) => {
                emit(&TurnEvent::Error {
                    message: e.to_string(),
                    hint: None,
                });
                ("error", format!("error: {e}"), Usage::default())
            }
        };
        let done = TurnEvent::Done {
            stop_reason: stop.into(),
            text,
            steps: 0,
            usage,
        };
        emit(&done);
        Ok(done)
    }
}
