//! A compaction applied to a conversation (spec agent-loop.md §5, book
//! ch. 12): plan, summarise, store.
//!
//! The summary is appended to `messages.jsonl` (which only grows) as a user
//! message of kind `summary`; `context.json` becomes the summary's id
//! followed by the kept ids (the summarised ids leave it); and
//! `compaction-event.json` records the compaction. Recompiling the system
//! prompt afterwards is the caller's (`super::TurnContext`).
//!
//! A sliding-window compaction whose plan fails, or whose result would
//! still not fit the window (`tokens_after ≥ W`), is replaced by an `all`
//! one of the same context (with the default `all` prompt unless the
//! agent's prompt is for `all`); the sliding summary is then not stored.
//! A plan that would summarise nothing, or only a lone earlier summary,
//! compacts nothing.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::estimate::{is_summary, message_tokens, messages_tokens, text_tokens};
use super::plan::{self, Plan, PlanError};
use super::transcript::{
    self, ALL_PROMPT, CompactionStats, DEFAULT_CLIP_CHARS, LADDER, NO_MESSAGES, SLIDING_PROMPT,
};
use crate::protocol::messages::{ModelFailure, Part, Role};
use crate::store::conversation::{Conversation, ConversationError, StoredMessage};
/// The agent's settings are part of its record (`agent.json`).
pub use crate::store::record::{CompactionSettings, Mode};

/// Why a compaction runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The context passed the threshold (before a request or after a
    /// response).
    ContextWindowLimit,
    /// The provider said the request did not fit.
    ContextWindowOverflow,
    /// `mini-letta compact`.
    Manual,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::ContextWindowLimit => "context_window_limit",
            Trigger::ContextWindowOverflow => "context_window_overflow",
            Trigger::Manual => "manual",
        }
    }
}

/// How long a message may be in a summary's transcript (`None`: whole).
fn clip(settings: &CompactionSettings) -> Option<usize> {
    match settings.clip_chars {
        Some(0) => None,
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        None => Some(DEFAULT_CLIP_CHARS),
    }
}

/// The prompt for `mode`: the agent's own when it was written for that
/// mode (the agent's mode, sliding window by default), else the default.
fn prompt(settings: &CompactionSettings, mode: Mode) -> &str {
    match &settings.prompt {
        Some(p) if settings.mode.unwrap_or_default() == mode => p,
        _ => match mode {
            Mode::All => ALL_PROMPT,
            Mode::SlidingWindow => SLIDING_PROMPT,
        },
    }
}

/// Who writes summaries: the model, through the supervisor's proxy (the
/// agent child), or a stand-in (tests, benchmarks).
pub trait Summarizer {
    /// The model's answer to `system` with the one user message
    /// `transcript`.
    fn summarize(&mut self, system: &str, transcript: &str) -> Result<String, ModelFailure>;
}

/// Why a compaction did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error(transparent)]
    Conversation(#[from] ConversationError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("the summariser failed: {0}")]
    Model(#[from] ModelFailure),
}

/// `compaction-event.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionEvent {
    /// When (RFC 3339).
    pub at: String,
    pub trigger: String,
    /// The mode applied (`all` when a sliding window fell back to it).
    pub mode: String,
    pub summary_message_id: String,
    pub first_evicted_id: Option<String>,
    pub last_evicted_id: Option<String>,
    pub messages_before: u64,
    pub messages_after: u64,
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub context_window: Option<u64>,
}

/// What a compaction asks for.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub trigger: Trigger,
    /// The mode asked for (the agent's, or `compact --mode`).
    pub mode: Mode,
    pub window: Option<u64>,
    pub settings: &'a CompactionSettings,
}

/// A compaction made and stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Compacted {
    pub event: CompactionEvent,
    pub stats: CompactionStats,
    pub summary: String,
}

/// A summary of `messages[..plan.cut]`, not yet stored.
struct Draft {
    mode: Mode,
    cut: usize,
    summary: String,
    tokens_after: u64,
}

/// Summarise `messages` with `prompt`; on overflow, again with the
/// transcript cut to each budget of the ladder.
pub fn summarize(
    messages: &[&StoredMessage],
    prompt: &str,
    clip: Option<usize>,
    summarizer: &mut dyn Summarizer,
) -> Result<String, ModelFailure> {
    if messages.is_empty() {
        return Ok(NO_MESSAGES.to_string());
    }
    let primary = transcript::transcript(messages, None);
    let text = match summarizer.summarize(prompt, &primary) {
        Ok(t) => t,
        Err(first @ ModelFailure::ContextOverflow { .. }) => {
            let mut last = first;
            let mut previous = primary;
            let mut found = None;
            for budget in LADDER {
                let cut = transcript::transcript(messages, Some(budget));
                if cut == previous {
                    continue;
                }
                match summarizer.summarize(prompt, &cut) {
                    Ok(t) => {
                        found = Some(t);
                        break;
                    }
                    Err(e @ ModelFailure::ContextOverflow { .. }) => last = e,
                    Err(e) => return Err(e),
                }
                previous = cut;
            }
            found.ok_or(last)?
        }
        Err(e) => return Err(e),
    };
    let summary = transcript::clip_summary(&text, clip);
    if summary.is_empty() {
        return Err(ModelFailure::fatal(
            "the summariser returned an empty summary",
        ));
    }
    Ok(summary)
}

/// A plan that would leave things as they are: nothing summarised, or only
/// an earlier summary on its own.
fn check_worth_it(messages: &[&StoredMessage], plan: Plan) -> Result<Plan, PlanError> {
    if messages.is_empty() {
        return Err(PlanError::NothingToSummarize("no messages in context"));
    }
    match &messages[..plan.cut] {
        [] => Err(PlanError::NothingToSummarize(
            "every message waits for the model",
        )),
        [only] if is_summary(only) => Err(PlanError::NothingToSummarize(
            "only the last summary would be summarised again",
        )),
        _ => Ok(plan),
    }
}

fn draft(
    messages: &[&StoredMessage],
    mode: Mode,
    plan: Plan,
    req: &Request,
    summarizer: &mut dyn Summarizer,
) -> Result<Draft, CompactError> {
    let prompt = prompt(req.settings, mode);
    let summary = summarize(
        &messages[..plan.cut],
        prompt,
        clip(req.settings),
        summarizer,
    )?;
    let tokens_after = text_tokens(&summary) + messages_tokens(&messages[plan.cut..]);
    Ok(Draft {
        mode,
        cut: plan.cut,
        summary,
        tokens_after,
    })
}

/// Compact `conv` (see the module doc).
pub fn compact(
    conv: &mut Conversation,
    req: &Request,
    summarizer: &mut dyn Summarizer,
) -> Result<Compacted, CompactError> {
    let owned: Vec<StoredMessage> = conv.context()?.into_iter().cloned().collect();
    let messages: Vec<&StoredMessage> = owned.iter().collect();
    let mut chosen = None;
    if req.mode == Mode::SlidingWindow {
        let planned = plan::sliding(
            &messages,
            req.settings.sliding_window_percentage,
            req.window,
        )
        .and_then(|p| check_worth_it(&messages, p));
        if let Ok(p) = planned {
            let d = draft(&messages, Mode::SlidingWindow, p, req, summarizer)?;
            // Still over the whole window: the next request would fail.
            if req.window.is_none_or(|w| d.tokens_after < w) {
                chosen = Some(d);
            }
        }
    }
    let d = match chosen {
        Some(d) => d,
        None => {
            let p = check_worth_it(&messages, plan::all(&messages))?;
            draft(&messages, Mode::All, p, req, summarizer)?
        }
    };
    // One message summarised into one no smaller is no compaction.
    if d.cut <= 1 && d.tokens_after >= messages_tokens(&messages) {
        return Err(PlanError::NothingToSummarize(
            "summarising would not make the context smaller",
        )
        .into());
    }
    apply(conv, &messages, d, req)
}

/// Summaries are never asked to be shorter than this many tokens: below
/// it nothing useful is left.
const MIN_SUMMARY_TOKENS: u64 = 32;

/// Rung 5 of the ladder (see `fit`): the context's first message is its
/// summary and there is no room for it (the system prompt grew after a
/// reflection merged, and `all` would only summarise the summary again).
/// Summarise that summary within `budget` tokens, clipped to it if the
/// answer is longer; the rest of the context stays as it is.
pub(crate) fn shorten_summary(
    conv: &mut Conversation,
    req: &Request,
    budget: u64,
    summarizer: &mut dyn Summarizer,
) -> Result<Compacted, CompactError> {
    let owned: Vec<StoredMessage> = conv.context()?.into_iter().cloned().collect();
    let messages: Vec<&StoredMessage> = owned.iter().collect();
    if !messages.first().is_some_and(|m| is_summary(m)) {
        return Err(PlanError::NothingToSummarize("the context begins with no summary").into());
    }
    // What packaging adds to a summary's own text (the note, the intro,
    // the statistics), measured on an empty one.
    let overhead = text_tokens(&transcript::package_summary(
        "",
        // Figures as wide as real ones get.
        &CompactionStats {
            trigger: Trigger::ContextWindowOverflow.as_str().to_string(),
            context_tokens_before: 100_000,
            context_tokens_after: 100_000,
            context_window: Some(1_000_000),
            messages_count_before: 10_000,
            messages_count_after: 10_000,
        },
        false,
        "2026-01-01T00:00:00.000Z",
    ));
    let tokens = budget.saturating_sub(overhead).max(MIN_SUMMARY_TOKENS);
    let chars = usize::try_from(tokens.saturating_mul(4)).unwrap_or(usize::MAX);
    let summary = summarize(
        &messages[..1],
        prompt(req.settings, Mode::All),
        Some(chars),
        summarizer,
    )?;
    let tokens_after = text_tokens(&summary) + messages_tokens(&messages[1..]);
    if tokens_after >= messages_tokens(&messages) {
        return Err(PlanError::NothingToSummarize("the summary is as short as it gets").into());
    }
    let d = Draft {
        mode: Mode::All,
        cut: 1,
        summary,
        tokens_after,
    };
    apply(conv, &messages, d, req)
}

/// Store a compaction.
fn apply(
    conv: &mut Conversation,
    messages: &[&StoredMessage],
    d: Draft,
    req: &Request,
) -> Result<Compacted, CompactError> {
    let now = OffsetDateTime::now_utc();
    let stats = CompactionStats {
        trigger: req.trigger.as_str().to_string(),
        context_tokens_before: messages_tokens(messages),
        context_tokens_after: d.tokens_after,
        context_window: req.window,
        messages_count_before: messages.len() as u64,
        messages_count_after: 1 + (messages.len() - d.cut) as u64,
    };
    let time = crate::clock::rfc3339(
        now.replace_nanosecond(now.millisecond() as u32 * 1_000_000)
            .unwrap_or(now),
    );
    let text =
        transcript::package_summary(&d.summary, &stats, d.mode == Mode::SlidingWindow, &time);
    let id = conv.next_id();
    let mut ids = vec![id.clone()];
    ids.extend(messages[d.cut..].iter().map(|m| m.id.clone()));
    let summary_message = StoredMessage {
        kind: Some("summary".into()),
        ..StoredMessage::new(id.clone(), Role::User, vec![Part::text(text)])
    };
    // What the context holds now, measured as `context` will: the stored
    // summary (packaged, larger than the summary's own text) and the rest.
    let tokens_after = message_tokens(&summary_message) + messages_tokens(&messages[d.cut..]);
    conv.append_and_set_context(summary_message, &ids)?;
    let evicted = &messages[..d.cut];
    let event = CompactionEvent {
        at: crate::clock::rfc3339(now),
        trigger: stats.trigger.clone(),
        mode: d.mode.as_str().to_string(),
        summary_message_id: id,
        first_evicted_id: evicted.first().map(|m| m.id.clone()),
        last_evicted_id: evicted.last().map(|m| m.id.clone()),
        messages_before: stats.messages_count_before,
        messages_after: stats.messages_count_after,
        tokens_before: stats.context_tokens_before,
        tokens_after,
        context_window: req.window,
    };
    conv.write_compaction_event(&event)?;
    Ok(Compacted {
        event,
        stats,
        summary: d.summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::Home;

    /// Summarises as `S(<number of transcript lines>)`, or overflows above
    /// `max` characters; records what it was sent.
    struct Fake {
        max: usize,
        /// Characters added to every summary.
        pad: usize,
        seen: Vec<(String, String)>,
    }

    impl Summarizer for Fake {
        fn summarize(&mut self, system: &str, transcript: &str) -> Result<String, ModelFailure> {
            self.seen.push((system.to_string(), transcript.to_string()));
            if transcript.chars().count() > self.max {
                return Err(ModelFailure::ContextOverflow {
                    message: "too long".into(),
                });
            }
            Ok(format!(
                "  S({}){}  ",
                transcript.lines().filter(|l| l.starts_with('[')).count(),
                ".".repeat(self.pad)
            ))
        }
    }

    fn fake() -> Fake {
        Fake {
            max: usize::MAX,
            pad: 0,
            seen: Vec::new(),
        }
    }

    fn conversation(dir: &std::path::Path, texts: &[(Role, &str)]) -> Conversation {
        let agent = Home::at(dir).agent("agent-x").unwrap();
        let mut c = Conversation::open(&agent, "default").unwrap();
        for (role, text) in texts {
            let id = c.next_id();
            c.append(StoredMessage::new(id, *role, vec![Part::text(*text)]))
                .unwrap();
        }
        c
    }

    fn request(trigger: Trigger, mode: Mode, window: Option<u64>) -> Request<'static> {
        static DEFAULTS: std::sync::LazyLock<CompactionSettings> =
            std::sync::LazyLock::new(CompactionSettings::default);
        Request {
            trigger,
            mode,
            window,
            settings: &DEFAULTS,
        }
    }

    const TEN: [(Role, &str); 10] = [
        (Role::User, "one"),
        (Role::Assistant, "two"),
        (Role::User, "three"),
        (Role::Assistant, "four"),
        (Role::User, "five"),
        (Role::Assistant, "six"),
        (Role::User, "seven"),
        (Role::Assistant, "eight"),
        (Role::User, "nine"),
        (Role::Assistant, "ten"),
    ];

    #[test]
    fn sliding_compaction_replaces_the_oldest_messages_by_a_summary() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = conversation(dir.path(), &TEN);
        let mut s = fake();
        let done = compact(
            &mut c,
            &request(Trigger::Manual, Mode::SlidingWindow, Some(900)),
            &mut s,
        )
        .unwrap();
        // p = 0.4: idx 4 → the assistant at 3 ("four").
        assert_eq!(done.event.mode, "sliding_window");
        assert_eq!(done.event.first_evicted_id.as_deref(), Some("msg-000001"));
        assert_eq!(done.event.last_evicted_id.as_deref(), Some("msg-000003"));
        assert_eq!(
            (done.event.messages_before, done.event.messages_after),
            (10, 8)
        );
        assert_eq!(done.summary, "S(3)");
        assert_eq!(s.seen[0].0, SLIDING_PROMPT);
        assert!(
            s.seen[0]
                .1
                .starts_with(" \n[user] one\n[assistant] two\n[user] three\n")
        );
        // The log only grows; the context lost the evicted ids and gained
        // the summary's.
        let c =
            Conversation::open(&Home::at(dir.path()).agent("agent-x").unwrap(), "default").unwrap();
        assert_eq!(c.messages().len(), 11);
        let ids = c.context_ids().unwrap();
        assert_eq!(ids[0], done.event.summary_message_id);
        assert_eq!(ids[1], "msg-000004");
        assert_eq!(ids.len(), 8);
        let summary = c.messages().last().unwrap();
        assert_eq!(summary.kind.as_deref(), Some("summary"));
        assert_eq!(summary.role, Role::User);
        assert!(
            summary
                .text()
                .contains("\"compaction_stats\":{\"trigger\":\"manual\"")
        );
        assert!(
            summary
                .text()
                .contains("Note: 2 messages from the beginning")
        );
        let event: CompactionEvent =
            serde_json::from_slice(&c.compaction_event_bytes().unwrap().unwrap()).unwrap();
        assert_eq!(event, done.event);
    }

    #[test]
    fn sliding_falls_back_to_all_when_it_cannot_plan_or_still_overflows() {
        let dir = tempfile::tempdir().unwrap();
        let three = [(Role::User, "a"), (Role::Assistant, "b"), (Role::User, "c")];
        let mut c = conversation(dir.path(), &three);
        let mut s = fake();
        let done = compact(
            &mut c,
            &request(Trigger::ContextWindowLimit, Mode::SlidingWindow, Some(900)),
            &mut s,
        )
        .unwrap();
        assert_eq!(done.event.mode, "all");
        assert_eq!(s.seen.len(), 1);
        assert_eq!(s.seen[0].0, ALL_PROMPT);
        // The pending user message is kept.
        assert_eq!(done.event.messages_after, 2);
        assert!(done.stats.context_window == Some(900));

        // A sliding result that would not fit the window (a 1,000-token
        // summary in 900): all instead, and only the all summary is stored.
        let dir = tempfile::tempdir().unwrap();
        let mut c = conversation(dir.path(), &TEN);
        let before = c.messages().len();
        let mut s = Fake {
            pad: 4000,
            ..fake()
        };
        let done = compact(
            &mut c,
            &request(Trigger::Manual, Mode::SlidingWindow, Some(900)),
            &mut s,
        )
        .unwrap();
        assert_eq!(done.event.mode, "all");
        assert_eq!(s.seen.len(), 2);
        assert_eq!(c.messages().len(), before + 1);
        assert_eq!(c.context_ids().unwrap().len(), 1);
    }

    #[test]
    fn all_keeps_a_pending_tool_call_verbatim() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = conversation(dir.path(), &TEN[..3]);
        let id = c.next_id();
        c.append(StoredMessage::new(
            id.clone(),
            Role::Assistant,
            vec![Part::ToolCall {
                id: "call".into(),
                name: "Bash".into(),
                arguments: serde_json::json!({"command": "ls"}),
            }],
        ))
        .unwrap();
        let mut s = fake();
        let done = compact(
            &mut c,
            &request(Trigger::ContextWindowOverflow, Mode::All, None),
            &mut s,
        )
        .unwrap();
        assert_eq!(done.event.trigger, "context_window_overflow");
        let ctx = c.context().unwrap();
        assert_eq!(ctx.len(), 2);
        assert_eq!(ctx[1].id, id);
        assert!(matches!(ctx[1].parts[0], Part::ToolCall { .. }));
        assert_eq!(done.event.last_evicted_id.as_deref(), Some("msg-000003"));
    }

    #[test]
    fn nothing_to_compact_leaves_the_conversation_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = conversation(dir.path(), &[(Role::User, "记住: 我喜欢茶")]);
        let mut s = fake();
        let e = compact(
            &mut c,
            &request(Trigger::ContextWindowLimit, Mode::All, Some(900)),
            &mut s,
        )
        .unwrap_err();
        assert!(
            matches!(e, CompactError::Plan(PlanError::NothingToSummarize(_))),
            "{e}"
        );
        assert!(s.seen.is_empty());
        assert_eq!(c.messages().len(), 1);
        assert_eq!(c.context().unwrap()[0].text(), "记住: 我喜欢茶");
        // A lone earlier summary is not summarised again.
        let dir = tempfile::tempdir().unwrap();
        let mut c = conversation(
            dir.path(),
            &[(Role::User, "hi"), (Role::Assistant, "answer")],
        );
        compact(&mut c, &request(Trigger::Manual, Mode::All, None), &mut s).unwrap();
        let e = compact(&mut c, &request(Trigger::Manual, Mode::All, None), &mut s).unwrap_err();
        assert!(e.to_string().contains("only the last summary"), "{e}");
    }

    #[test]
    fn an_overflowing_transcript_goes_down_the_ladder() {
        let dir = tempfile::tempdir().unwrap();
        let long = "x".repeat(30_000);
        let texts: Vec<(Role, &str)> = (0..10)
            .map(|i| {
                (
                    if i % 2 == 0 {
                        Role::User
                    } else {
                        Role::Assistant
                    },
                    long.as_str(),
                )
            })
            .collect();
        let mut c = conversation(dir.path(), &texts);
        let mut s = Fake {
            max: 50_000,
            ..fake()
        };
        compact(&mut c, &request(Trigger::Manual, Mode::All, None), &mut s).unwrap();
        let sizes: Vec<usize> = s.seen.iter().map(|(_, t)| t.chars().count()).collect();
        // Whole, then cut to 120k and 90k (30 % head + 30 % tail: 72k and
        // 54k characters, refused), then to 60k (36k, accepted).
        assert_eq!(sizes.len(), 4, "{sizes:?}");
        assert!(sizes[0] > 300_000);
        assert!(sizes[2] > 50_000 && sizes[3] <= 50_000, "{sizes:?}");
        assert!(sizes[3] < 60_000 * 6 / 10 + 100, "{sizes:?}");
        assert!(s.seen[3].1.contains("[TRUNCATED: dropped"));
        // Nothing fits at all: the overflow is the error.
        let mut c = conversation(dir.path(), &texts);
        let mut s = Fake { max: 10, ..fake() };
        let e = compact(&mut c, &request(Trigger::Manual, Mode::All, None), &mut s).unwrap_err();
        assert!(matches!(
            e,
            CompactError::Model(ModelFailure::ContextOverflow { .. })
        ));
        assert_eq!(s.seen.len(), 1 + LADDER.len());
    }

    #[test]
    fn settings_choose_prompt_and_clip() {
        let own = CompactionSettings {
            mode: Some(Mode::All),
            prompt: Some("mine".into()),
            clip_chars: Some(0),
            sliding_window_percentage: None,
        };
        assert_eq!(prompt(&own, Mode::All), "mine");
        assert_eq!(prompt(&own, Mode::SlidingWindow), SLIDING_PROMPT);
        assert_eq!(clip(&own), None);
        assert_eq!(
            clip(&CompactionSettings::default()),
            Some(DEFAULT_CLIP_CHARS)
        );
        assert_eq!(Mode::parse("all"), Some(Mode::All));
        assert_eq!(Mode::parse("sliding_window"), Some(Mode::SlidingWindow));
        assert_eq!(Mode::parse("sliding"), None);
    }
}
