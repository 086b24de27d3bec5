//! Which messages a compaction summarises and which it keeps (spec
//! agent-loop.md §5, book ch. 12). A plan is a cut: `messages[..cut]` are
//! summarised, `messages[cut..]` kept verbatim after the summary.
//!
//! **Sliding window** (the default): needs at least 4 messages. The cut
//! must be an assistant message (the kept part starts with one), after the
//! first message and before `max_cut` — the last message, or the one before
//! it when the last is an assistant whose tool calls wait for results
//! (those calls and their results stay together). Starting from the
//! percentage `p` (0.3 unless set; ≤ 0 is 0.1, > 1 is 1), `p` grows by 0.1
//! (plain `f64` additions: 0.4, 0.5, 0.6, 0.7, 0.7999…, 0.8999…, 0.9999…,
//! 1.0999…) while the kept messages' estimate is at least `(1 − p) × W`
//! (the percentage the call started with) and `p < 1`; each round the cut
//! is the last valid one at or before `min(round(p × n), n − 1)`. The plan
//! fails when no cut was found, when `p` reached 1, or when the cut is not
//! before `max_cut`. Without a window the first cut found is taken.
//!
//! **All**: everything is summarised except what waits for the model: an
//! assistant's tool calls awaiting their results; those calls with their
//! results awaiting the model's answer; a user message not yet answered
//! (a compaction before a conversation's first reply must not summarise
//! away the user's only message — letta-code's all mode does, and the model
//! then answers the summary instead of the user).

use super::estimate::messages_tokens;
use crate::protocol::messages::{Part, Role};
use crate::store::conversation::StoredMessage;

/// The sliding window's starting percentage unless set.
pub const DEFAULT_SLIDING_PERCENTAGE: f64 = 0.3;

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("not enough messages for sliding window compaction ({0}, at least 4)")]
    TooFewMessages(usize),
    #[error("no assistant message found for sliding window compaction")]
    NoCut,
    #[error("assistant message index {cut} is at the end of the message buffer")]
    CutAtEnd { cut: usize },
    #[error("nothing to compact: {0}")]
    NothingToSummarize(&'static str),
}

/// A cut: summarise `messages[..cut]`, keep `messages[cut..]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub cut: usize,
}

/// Whether `m` is an assistant message with tool calls.
pub fn has_tool_calls(m: &StoredMessage) -> bool {
    m.role == Role::Assistant && m.parts.iter().any(|p| matches!(p, Part::ToolCall { .. }))
}

/// The percentage a setting asks for, normalised.
pub fn normalized_percentage(p: Option<f64>) -> f64 {
    match p {
        Some(p) if p.is_finite() => {
            if p <= 0.0 {
                0.1
            } else if p > 1.0 {
                1.0
            } else {
                p
            }
        }
        _ => DEFAULT_SLIDING_PERCENTAGE,
    }
}

/// The percentages a sliding plan tries, from `p` (normalised), in order.
#[cfg(test)]
pub(crate) fn percentage_series(p: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut p = p;
    while p < 1.0 {
        p += 0.1;
        out.push(p);
    }
    out
}

/// The sliding-window plan of `messages` (see the module doc).
pub fn sliding(
    messages: &[&StoredMessage],
    percentage: Option<f64>,
    window: Option<u64>,
) -> Result<Plan, PlanError> {
    let n = messages.len();
    if n < 4 {
        return Err(PlanError::TooFewMessages(n));
    }
    let p0 = normalized_percentage(percentage);
    let max_cut = if messages.last().is_some_and(|m| has_tool_calls(m)) {
        n - 2
    } else {
        n - 1
    };
    let goal = window.map(|w| (1.0 - p0) * w as f64);
    let valid = |i: usize| messages[i].role == Role::Assistant && i > 0 && i < max_cut;
    let mut kept_tokens = window.map_or(f64::INFINITY, |w| w as f64);
    let mut cut: Option<usize> = None;
    let mut p = p0;
    loop {
        let go_on = match goal {
            Some(g) => kept_tokens >= g,
            None => cut.is_none(),
        };
        if !(go_on && p < 1.0) {
            break;
        }
        p += 0.1;
        let idx = ((p * n as f64).round() as usize).min(n - 1);
        cut = (0..=idx).rev().find(|&i| valid(i));
        let Some(c) = cut else { continue };
        kept_tokens = messages_tokens(&messages[c..]) as f64;
    }
    let cut = match cut {
        Some(c) if p < 1.0 => c,
        _ => return Err(PlanError::NoCut),
    };
    if cut >= max_cut {
        return Err(PlanError::CutAtEnd { cut });
    }
    Ok(Plan { cut })
}

/// The all plan of `messages` (see the module doc): what waits for the
/// model is kept.
pub fn all(messages: &[&StoredMessage]) -> Plan {
    // Reminders the harness stored at the end (a memory update, a notice)
    // belong to what waits; what waits is judged by what comes before them.
    let trailing = messages
        .iter()
        .rev()
        .take_while(|m| is_harness_reminder(m))
        .count();
    let body = &messages[..messages.len() - trailing];
    let n = body.len();
    let pending = match body.last() {
        None => 0,
        Some(last) => match last.role {
            Role::Assistant if has_tool_calls(last) => 1,
            Role::Tool if n >= 2 && has_tool_calls(body[n - 2]) => 2,
            Role::User if !super::estimate::is_summary(last) => 1,
            _ => 0,
        },
    };
    Plan { cut: n - pending }
}

/// A user message the harness stored for the model (a `<memory_update>`,
/// a notice), not one the user wrote.
pub(crate) fn is_harness_reminder(m: &StoredMessage) -> bool {
    m.role == Role::User && matches!(m.kind.as_deref(), Some("memory_update" | "reminder"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(id: usize, role: Role, text: &str) -> StoredMessage {
        StoredMessage {
            id: format!("msg-{id}"),
            role,
            parts: vec![Part::text(text)],
            kind: None,
            usage: None,
            stop: None,
            model: None,
            ts: "2026-01-01T00:00:00Z".into(),
        }
    }

    fn call(id: usize) -> StoredMessage {
        StoredMessage {
            parts: vec![Part::ToolCall {
                id: format!("c{id}"),
                name: "Bash".into(),
                arguments: json!({"command": "ls"}),
            }],
            ..m(id, Role::Assistant, "")
        }
    }

    /// `pairs` user/assistant exchanges of `chars` characters each.
    fn exchanges(pairs: usize, chars: usize) -> Vec<StoredMessage> {
        let text = "x".repeat(chars);
        (0..pairs * 2)
            .map(|i| {
                let role = if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                };
                m(i + 1, role, &text)
            })
            .collect()
    }

    fn refs(v: &[StoredMessage]) -> Vec<&StoredMessage> {
        v.iter().collect()
    }

    #[test]
    fn the_percentage_series_is_plain_float_addition() {
        let s = percentage_series(0.3);
        assert_eq!(s.len(), 8);
        assert_eq!(&s[..4], &[0.4, 0.5, 0.6, 0.7]);
        assert_eq!(s[4], 0.7999999999999999);
        assert_eq!(s[5], 0.8999999999999999);
        assert_eq!(s[6], 0.9999999999999999);
        assert_eq!(s[7], 1.0999999999999999);
        assert_eq!(normalized_percentage(None), 0.3);
        assert_eq!(normalized_percentage(Some(0.0)), 0.1);
        assert_eq!(normalized_percentage(Some(-3.0)), 0.1);
        assert_eq!(normalized_percentage(Some(7.0)), 1.0);
        assert_eq!(normalized_percentage(Some(f64::NAN)), 0.3);
        assert_eq!(normalized_percentage(Some(0.5)), 0.5);
    }

    #[test]
    fn sliding_needs_four_messages() {
        let v = exchanges(1, 10);
        assert_eq!(
            sliding(&refs(&v), None, Some(900)),
            Err(PlanError::TooFewMessages(2))
        );
    }

    #[test]
    fn sliding_cuts_at_an_assistant_and_grows_until_the_rest_fits() {
        // 10 messages of 100 tokens each, window 1000: the goal is 700.
        let v = exchanges(5, 400);
        let r = refs(&v);
        // p = 0.4: idx 4 (user) → cut 3 (assistant), keep 7 × 100 = 700 ≥ 700;
        // p = 0.5: idx 5 → cut 5, keep 500 < 700.
        assert_eq!(sliding(&r, None, Some(1000)), Ok(Plan { cut: 5 }));
        assert_eq!(r[5].role, Role::Assistant);
        // A roomy window stops at the first round.
        assert_eq!(sliding(&r, None, Some(100_000)), Ok(Plan { cut: 3 }));
        // Without a window, the first cut found.
        assert_eq!(sliding(&r, None, None), Ok(Plan { cut: 3 }));
        // A larger starting percentage cuts later.
        assert_eq!(sliding(&r, Some(0.6), Some(100_000)), Ok(Plan { cut: 7 }));
    }

    #[test]
    fn sliding_never_cuts_at_the_first_or_the_last_message() {
        // Only the last message is an assistant: no valid cut.
        let mut v: Vec<StoredMessage> = (1..=5).map(|i| m(i, Role::User, "u")).collect();
        v.push(m(6, Role::Assistant, "a"));
        assert_eq!(sliding(&refs(&v), None, Some(900)), Err(PlanError::NoCut));
        // Only the first message is an assistant: no valid cut either.
        let mut v = vec![m(1, Role::Assistant, "a")];
        v.extend((2..=5).map(|i| m(i, Role::User, "u")));
        assert_eq!(sliding(&refs(&v), None, Some(900)), Err(PlanError::NoCut));
    }

    #[test]
    fn sliding_keeps_a_pending_tool_call_with_the_message_before_it() {
        // user, assistant, user, assistant(calls): max_cut = n − 2 = 2, so
        // the assistant at 1 is the only cut.
        let v = vec![
            m(1, Role::User, "u"),
            m(2, Role::Assistant, "a"),
            m(3, Role::User, "u"),
            call(4),
        ];
        assert_eq!(sliding(&refs(&v), None, Some(1000)), Ok(Plan { cut: 1 }));
        // With the tool call second to last, it may not be cut at either.
        let v = vec![
            m(1, Role::User, "u"),
            m(2, Role::User, "u"),
            m(3, Role::User, "u"),
            call(4),
        ];
        assert_eq!(sliding(&refs(&v), None, Some(1000)), Err(PlanError::NoCut));
    }

    #[test]
    fn sliding_fails_when_p_reaches_one() {
        // Everything huge: the kept part never fits, p passes 1.
        let v = exchanges(5, 40_000);
        assert_eq!(sliding(&refs(&v), None, Some(1000)), Err(PlanError::NoCut));
    }

    #[test]
    fn all_summarises_everything_but_what_waits() {
        let mut v = exchanges(2, 10);
        assert_eq!(all(&refs(&v)), Plan { cut: 4 });
        // A tool call awaiting its result stays verbatim.
        v.push(m(5, Role::User, "run"));
        v.push(call(6));
        assert_eq!(all(&refs(&v)), Plan { cut: 5 });
        assert!(has_tool_calls(refs(&v)[5]));
        // With its results in, the call and the results await the answer.
        v.push(StoredMessage {
            parts: vec![Part::ToolResult {
                call_id: "c6".into(),
                name: "Bash".into(),
                text: "ok".into(),
                is_error: false,
            }],
            ..m(7, Role::Tool, "")
        });
        assert_eq!(all(&refs(&v)), Plan { cut: 5 });
        assert_eq!(all(&[]), Plan { cut: 0 });
    }

    #[test]
    fn all_never_summarises_the_users_only_message_before_its_reply() {
        // Pre-flight compaction on a conversation's first message.
        let first = m(1, Role::User, "记住: 我喜欢茶");
        assert_eq!(all(&[&first]), Plan { cut: 0 });
        // After an earlier summary, the pending message is kept too.
        let summary = StoredMessage {
            kind: Some("summary".into()),
            ..m(2, Role::User, "{\"type\":\"system_alert\"}")
        };
        let next = m(3, Role::User, "and now?");
        assert_eq!(all(&[&summary, &next]), Plan { cut: 1 });
        // A summary as the last message is not a pending user message.
        assert_eq!(all(&[&first, &summary]), Plan { cut: 2 });
    }

    #[test]
    fn all_keeps_a_pending_tool_round_behind_a_stored_memory_update() {
        let mut v = exchanges(1, 10);
        v.push(m(3, Role::User, "记住: tea"));
        v.push(call(4));
        v.push(StoredMessage {
            parts: vec![Part::ToolResult {
                call_id: "c4".into(),
                name: "memory".into(),
                text: "Memory insert committed locally (abc1234).".into(),
                is_error: false,
            }],
            ..m(5, Role::Tool, "")
        });
        v.push(StoredMessage {
            kind: Some("memory_update".into()),
            ..m(6, Role::User, "<system-reminder>\n<memory_update>…")
        });
        // The call, its results and the update wait for the answer.
        assert_eq!(all(&refs(&v)), Plan { cut: 3 });
        // A user's message behind a notice waits too.
        let notice = StoredMessage {
            kind: Some("reminder".into()),
            ..m(8, Role::User, "<system-reminder>MEMORY REVISION INVALID")
        };
        let first = m(7, Role::User, "hello");
        assert_eq!(all(&[&first, &notice]), Plan { cut: 0 });
    }
}
