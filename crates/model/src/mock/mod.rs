//! The deterministic offline model, the default when nothing is configured.
//! It lets a fresh machine (and every test) run whole turns — memory tool
//! calls, tool-result follow-ups, compaction summaries, reflections — with no
//! network and byte-stable answers, while still reporting usage so that the
//! context-window paths are exercised.
//!
//! Rules, applied to the last user message's text (the last text part once
//! `<system-reminder>…</system-reminder>` blocks are removed, trimmed; a
//! captured `X` is trimmed of whitespace and trailing `。.!！`):
//!
//! | user text | answer |
//! |---|---|
//! | `run: CMD` (start, any case) | `Bash {"command":CMD,"description":"run CMD"}` |
//! | `忘掉: X` / `forget: X` | `memory str_replace human.md old_string X, new_string ""` (deletes the lines containing X) |
//! | `记住: X` / `remember: X` | `memory insert human.md insert_text "- X"` |
//! | `设定: X` | `memory insert persona.md insert_text "- X"` |
//! | `提交记忆` / `commit your memory` (start) | `memory commit` (every uncommitted edit) |
//! | `后台记住: X` / `in the background, remember: X` | `memory delegate instruction "记住: X"` (a memory worker) |
//! | `回忆: X` / `recall: X` | `recall_search {"query": X, "subagent": true}` (a recall sub-agent) |
//! | `<reflection-integration branch="B">…` (an explicit-mode integration turn) | `memory merge branch B`, or, when its `<reflection-merge-instructions>` say `do not merge` / `不要合并`, the text `不合并：…` |
//! | `别再叫我 X 了，叫我 Y` / `don't call me X, call me Y` | `memory str_replace human.md X → Y` |
//! | `你知道我什么` / `what do you know about me` | text `我记得：A；B。`, the `- ` lines of the newest `<human>` block in view (`我还不知道关于你的事。` when none) |
//! | anything else | text `mock: <user text>` |
//!
//! Answers are in the language the user's words are in: Chinese when they
//! hold a Han, Kana or Hangul character (the book's labs), else English
//! (`I remember: A; B.`, `OK, memory updated (commit <rev>).`, `That
//! failed: …`, `Tool result: …`); the Chinese forms are below.
//!
//! When the last message (reminder-only user messages skipped) holds tool
//! results: `操作失败：<first error text>`
//! if one failed, else after `memory` `好的，已更新记忆（提交 <rev>）。` when
//! the result names the commit that landed (`记忆没有变化：<result>` when it
//! does not), else
//! `工具结果：<first result, 200 chars>`.
//!
//! [`Purpose::Summary`] (a compaction): the request's user message is the
//! transcript the agent built (`[role] text` entries, spec agent-loop.md
//! §5), `<system-reminder>` blocks removed. The answer is
//! `Summary of N messages:` (N = the transcript's entries) then the facts it
//! kept, one `- ` line each (at most 80 characters, at most
//! [`SUMMARY_MAX_FACTS`], the oldest first): every `- ` line of a user entry
//! (what an earlier summary carried), then the first line of each user
//! entry's own words. So a fact taught before a compaction is still named
//! after it, and after the next one (an earlier summary is a user entry).
//! A request that is not a transcript (no entries) is summarised one
//! message a line, `[role] <first line, 80 chars>`.
//!
//! [`Purpose::Reflection`]: the line after `Additional user-provided
//! reflection instruction` gives keywords (words split on anything not a
//! letter or digit and on a few Chinese function words and the
//! instruction's own verbs such as `记住`, lower-cased, at least 3
//! characters (2 for non-ASCII, 1 for Han), minus filter words such as
//! `only`, `facts`);
//! every `- ` line of the request's messages that contains one of them is a
//! kept fact (all of them when there is no instruction). The answer is
//!
//! ```text
//! Reflection instruction: <instruction or (none)>
//! Keywords: <k1, k2, …>
//! Matching facts:
//! - fact one
//! ```
//!
//! or `Matching facts: (none)` when nothing matched.
//!
//! A reflection or memory worker offered the `memory` tool edits instead:
//! its task's `[user] …` transcript lines that state something about the
//! user (first person — `我叫/是/喜欢/住/在/有…`, `I am/I'm/I like/I live/I
//! work/I have/My …` — not a question, not one of the rules above) or are
//! `- ` lines, filtered by the instruction's keywords and minus what the
//! task's `<parent_memory>` already holds, become one `memory insert
//! human.md` of `- fact` lines. A `别再叫我 X 了，叫我 Y` line whose X is in
//! the parent memory becomes `memory str_replace human.md X → Y` (an edit,
//! never an appended line). A memory worker's `<memory_request>` is read
//! the same way, one line at a time, except that `记住: X` / `remember: X`
//! there is the fact X to insert. Nothing new: no call, the report says `No
//! memory changes were needed.` After the tool result the answer is the
//! report above followed by the usual follow-up line. A recall sub-agent
//! (offered `recall_search`) searches for its `<recall_request>`, then
//! answers `Recall findings:` and the first five lines of the results.
//!
//! Usage is always reported: `input_tokens = ceil(request chars / 4)`
//! ([`request_chars`]), `output_tokens = ceil(response chars / 4)`. With a
//! context window set (`[providers.mock] context_window`, or the request's
//! own `context_window`: the smaller of the two), a request above it fails
//! with [`ModelError::ContextOverflow`], as a real provider would.

//!
//! The parts: `read.rs` (what the rules read of a request), `turn.rs` (a
//! turn's rules and follow-ups), `summary.rs` (compaction summaries),
//! `subagent.rs` (reflections, memory workers, recall sub-agents: their
//! reports and the tool calls they plan) and `response.rs` (usage, ids and
//! streaming, shared with the scripted mode).

mod read;
mod response;
mod subagent;
mod summary;
mod turn;

use crate::protocol::messages::{ModelRequest, ModelResponse, Part, Purpose};
use crate::provider::{Model, ModelError, ModelEvent};

pub use read::last_user_text;
pub(crate) use response::finish;
pub use response::{next_call_id, next_response_id, part_chars, request_chars, tokens};
pub use subagent::keywords;
use subagent::{recall_with_tools, reflect, reflect_with_tools};
pub use summary::SUMMARY_MAX_FACTS;
use summary::summarize;
use turn::answer_turn;

/// The rule-based deterministic model.
#[derive(Debug, Clone, Default)]
pub struct MockModel {
    context_window: Option<u64>,
}

impl MockModel {
    pub fn new() -> Self {
        Self::default()
    }

    /// Fail requests whose input tokens exceed `window` with a context
    /// overflow (Lab 4 uses 900).
    pub fn with_context_window(mut self, window: Option<u64>) -> Self {
        self.context_window = window;
        self
    }
}

impl Model for MockModel {
    fn complete(
        &self,
        request: &ModelRequest,
        on_event: &mut dyn FnMut(ModelEvent),
    ) -> Result<ModelResponse, ModelError> {
        let input_tokens = tokens(request_chars(request));
        let window = match (self.context_window, request.context_window) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(w) = window
            && input_tokens > w
        {
            return Err(ModelError::ContextOverflow {
                message: format!(
                    "prompt is too long: {input_tokens} tokens > {w} maximum (mock context window)"
                ),
            });
        }
        let parts = match request.purpose {
            Purpose::Summary => vec![Part::text(summarize(&request.messages))],
            // A sub-agent offered the memory tool edits; without tools the
            // answer is the report alone.
            Purpose::Reflection if request.tools.iter().any(|t| t.name == "memory") => {
                reflect_with_tools(&request.messages)
            }
            // A recall sub-agent searches, then reports what it found.
            Purpose::Reflection if request.tools.iter().any(|t| t.name == "recall_search") => {
                recall_with_tools(&request.messages)
            }
            Purpose::Reflection => vec![Part::text(reflect(&request.messages))],
            Purpose::Turn => answer_turn(&request.system, &request.messages),
        };
        Ok(finish(parts, input_tokens, None, "mock", on_event))
    }
}
