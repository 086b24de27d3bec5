//! Making one request fit the window when compacting in the agent's mode
//! was not enough (issue 31 §1): the ladder a step climbs, and the
//! trimming of tool results.
//!
//! The rungs, in order, each tried only when the request (estimated
//! without usage: system prompt + tools + messages) is still over the
//! whole window, or after the provider said it does not fit:
//!
//! 1. compact in the agent's mode (what the threshold already does);
//! 2. compact `all`: everything but what waits for the model;
//! 3. trim old tool results: in the request, every tool result but the
//!    latest message's is replaced by a one-line note;
//! 4. trim the latest tool results to what fits under the threshold (their
//!    head is kept, with the note);
//! 5. shorten the summary: when it alone leaves no room (the system prompt
//!    grew after a reflection merged), it is summarised again within what
//!    is left of the window — a conversation is never stuck behind its own
//!    summary.
//!
//! Then the request is sent as it is; if the provider refuses it, the
//! turn's error names the parts (`DoesNotFit`). Trimming changes only
//! what is sent: the log and the context keep every result whole, and the
//! next turn's compaction summarises them.

use super::estimate::{RequestTokens, request_tokens, text_tokens, tokens_for};
use crate::protocol::messages::{ModelRequest, Part, Role};

/// The rungs a step has climbed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fit {
    pub compacted: bool,
    pub compacted_all: bool,
    pub trimmed_old: bool,
    pub trimmed_latest: bool,
    pub shortened_summary: bool,
}

/// The next rung to climb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rung {
    Compact,
    CompactAll,
    TrimOld,
    TrimLatest,
    ShortenSummary,
}

impl Fit {
    /// The next rung, marked as climbed; `None` at the top.
    pub(crate) fn climb(&mut self) -> Option<Rung> {
        let (flag, rung) = if !self.compacted {
            (&mut self.compacted, Rung::Compact)
        } else if !self.compacted_all {
            (&mut self.compacted_all, Rung::CompactAll)
        } else if !self.trimmed_old {
            (&mut self.trimmed_old, Rung::TrimOld)
        } else if !self.trimmed_latest {
            (&mut self.trimmed_latest, Rung::TrimLatest)
        } else if !self.shortened_summary {
            (&mut self.shortened_summary, Rung::ShortenSummary)
        } else {
            return None;
        };
        *flag = true;
        Some(rung)
    }
}

/// The estimate of what `request` is made of.
pub fn parts(request: &ModelRequest) -> RequestTokens {
    request_tokens(&request.system, &request.messages, &request.tools)
}

/// How a trim note begins.
const NOTE_START: &str = "[tool result trimmed";

/// The note a trimmed result becomes (or ends with).
fn note(chars: usize, window: Option<u64>) -> String {
    let window = window.map(|w| format!(" {w}-token")).unwrap_or_default();
    format!(
        "{NOTE_START} to fit the{window} context window: {chars} characters; the conversation log keeps it whole]"
    )
}

/// Replace the text of every tool result before the last message with a
/// note. Whether anything changed.
pub(crate) fn trim_old(request: &mut ModelRequest) -> bool {
    let window = request.context_window;
    let last = request.messages.len().saturating_sub(1);
    let mut changed = false;
    for m in request.messages[..last]
        .iter_mut()
        .filter(|m| m.role == Role::Tool)
    {
        for p in &mut m.parts {
            if let Part::ToolResult { text, .. } = p {
                let n = note(text.chars().count(), window);
                if !text.starts_with(NOTE_START) && text.chars().count() > n.chars().count() {
                    *text = n;
                    changed = true;
                }
            }
        }
    }
    changed
}

/// Cut the tool results of the last message (when it holds any) so that
/// the request fits under `target` tokens: each keeps an equal share of
/// what is left, from its start, and ends with the note. Whether anything
/// changed.
pub(crate) fn trim_latest(request: &mut ModelRequest, target: u64) -> bool {
    let window = request.context_window;
    let Some(last) = request.messages.last() else {
        return false;
    };
    if last.role != Role::Tool {
        return false;
    }
    let results = last
        .parts
        .iter()
        .filter(|p| matches!(p, Part::ToolResult { .. }))
        .count();
    if results == 0 {
        return false;
    }
    let now = parts(request);
    let latest: u64 = last
        .parts
        .iter()
        .map(|p| match p {
            Part::ToolResult { text, .. } => text_tokens(text),
            _ => 0,
        })
        .sum();
    let without = now.total().saturating_sub(latest);
    // Room per result, in characters (4 a token), less its note.
    let room = target.saturating_sub(without) / results as u64;
    let mut changed = false;
    if let Some(m) = request.messages.last_mut() {
        for p in &mut m.parts {
            if let Part::ToolResult { text, .. } = p {
                let total = text.chars().count();
                let n = note(total, window);
                let keep = (room * 4).saturating_sub(n.chars().count() as u64 + 1) as usize;
                if tokens_for(total) > room {
                    let head: String = text.chars().take(keep).collect();
                    *text = format!("{head}\n{n}");
                    changed = true;
                }
            }
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::{Message, Purpose};

    fn result(text: &str) -> Message {
        Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: "c".into(),
                name: "Bash".into(),
                text: text.into(),
                is_error: false,
            }],
        }
    }

    fn request(messages: Vec<Message>) -> ModelRequest {
        ModelRequest {
            model: "mock".into(),
            system: "s".repeat(400),
            messages,
            tools: Vec::new(),
            max_tokens: None,
            purpose: Purpose::Turn,
            context_window: Some(900),
        }
    }

    #[test]
    fn the_ladder_climbs_once_per_rung() {
        let mut f = Fit::default();
        let rungs: Vec<Rung> = std::iter::from_fn(|| f.climb()).collect();
        assert_eq!(
            rungs,
            [
                Rung::Compact,
                Rung::CompactAll,
                Rung::TrimOld,
                Rung::TrimLatest,
                Rung::ShortenSummary
            ]
        );
        assert_eq!(f.climb(), None);
    }

    #[test]
    fn old_results_become_notes_and_the_latest_is_cut_to_fit() {
        let big = "x".repeat(8000);
        let mut r = request(vec![
            Message::user("go"),
            result(&big),
            Message::user("again"),
            result(&big),
        ]);
        assert!(trim_old(&mut r));
        let Part::ToolResult { text, .. } = &r.messages[1].parts[0] else {
            panic!()
        };
        assert!(text.starts_with(
            "[tool result trimmed to fit the 900-token context window: 8000 characters"
        ));
        // The latest is untouched by trim_old.
        assert_eq!(parts(&r).messages, 1 + text_tokens(text) + 2 + 2000);
        assert!(trim_latest(&mut r, 720));
        assert!(parts(&r).total() <= 720, "{:?}", parts(&r));
        let Part::ToolResult { text, .. } = &r.messages[3].parts[0] else {
            panic!()
        };
        assert!(text.starts_with("xxxx") && text.ends_with("keeps it whole]"));
        // Nothing left to trim.
        assert!(!trim_old(&mut r) && !trim_latest(&mut r, 720));
    }

    #[test]
    fn no_tool_results_nothing_trimmed() {
        let mut r = request(vec![Message::user("y".repeat(5000))]);
        assert!(!trim_old(&mut r));
        assert!(!trim_latest(&mut r, 720));
    }
}
