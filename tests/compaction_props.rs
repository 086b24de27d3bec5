//! Properties of the compaction planner (spec agent-loop.md §5) on random
//! well-formed conversations: user turns, assistant tool rounds with their
//! results, answers, and a conversation that may stop anywhere (a tool call
//! waiting for its results, results waiting for the model, a user message
//! not yet answered), with harness reminders after it.
//!
//! * sliding: a plan cuts at an assistant message after the first message
//!   and before the end; nothing kept is a tool result whose call was
//!   summarised; calls waiting for results are never summarised away;
//! * all: exactly what waits for the model is kept (and the reminders after
//!   it), never more than a call and its results.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mini_letta::agent::context::plan::{self, PlanError};
use mini_letta::protocol::messages::{Part, Role};
use mini_letta::store::conversation::StoredMessage;
use proptest::prelude::*;
use serde_json::json;

/// One step of a conversation's grammar.
#[derive(Debug, Clone)]
enum Step {
    /// A user turn, then `rounds` tool rounds, then an answer unless the
    /// turn is cut short (`stop`: 0 answered, 1 after a call, 2 after its
    /// results, 3 before any reply).
    Turn { rounds: usize, text_len: usize },
}

fn msg(n: usize, role: Role, parts: Vec<Part>) -> StoredMessage {
    StoredMessage::new(format!("msg-{n:06}"), role, parts)
}

fn text(n: usize, len: usize) -> Part {
    Part::Text {
        text: format!("m{n} {}", "x".repeat(len)),
    }
}

/// The messages of `steps`, the last turn stopped at `stop`, then
/// `reminders` harness reminders.
fn conversation(steps: &[Step], stop: u8, reminders: usize) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    let last = steps.len().saturating_sub(1);
    for (t, Step::Turn { rounds, text_len }) in steps.iter().enumerate() {
        let n = out.len();
        out.push(msg(n, Role::User, vec![text(n, *text_len)]));
        let cut_short = t == last && stop != 0;
        if cut_short && stop == 3 {
            break;
        }
        for r in 0..*rounds {
            let n = out.len();
            let id = format!("call-{t}-{r}");
            out.push(msg(
                n,
                Role::Assistant,
                vec![Part::ToolCall {
                    id: id.clone(),
                    name: "memory".into(),
                    arguments: json!({"command": "view"}),
                }],
            ));
            if cut_short && stop == 1 && r + 1 == *rounds {
                break;
            }
            let n = out.len();
            out.push(msg(
                n,
                Role::Tool,
                vec![Part::ToolResult {
                    call_id: id,
                    name: "memory".into(),
                    text: "ok".into(),
                    is_error: false,
                }],
            ));
        }
        if !cut_short {
            let n = out.len();
            out.push(msg(n, Role::Assistant, vec![text(n, *text_len)]));
        }
    }
    for _ in 0..reminders {
        let n = out.len();
        let mut m = msg(
            n,
            Role::User,
            vec![Part::Text {
                text: "<memory_update>…</memory_update>".into(),
            }],
        );
        m.kind = Some("memory_update".into());
        out.push(m);
    }
    out
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0usize..3, 0usize..400).prop_map(|(rounds, text_len)| Step::Turn { rounds, text_len }),
        1..12,
    )
}

/// The index of the assistant message whose call a tool message answers.
fn caller(messages: &[&StoredMessage], i: usize) -> Option<usize> {
    (0..i)
        .rev()
        .find(|&j| messages[j].role == Role::Assistant && plan::has_tool_calls(messages[j]))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn a_sliding_cut_never_splits_a_call_from_its_results(
        steps in steps(),
        stop in 0u8..4,
        percentage in prop_oneof![Just(None), (-0.5f64..1.5).prop_map(Some)],
        window in prop_oneof![Just(None), (50u64..20_000).prop_map(Some)],
    ) {
        let all = conversation(&steps, stop, 0);
        let messages: Vec<&StoredMessage> = all.iter().collect();
        let n = messages.len();
        match plan::sliding(&messages, percentage, window) {
            Ok(p) => {
                prop_assert!(p.cut >= 1 && p.cut < n, "cut {} of {n}", p.cut);
                prop_assert_eq!(messages[p.cut].role, Role::Assistant);
                // A call waiting for its results is kept.
                if plan::has_tool_calls(messages[n - 1]) {
                    prop_assert!(p.cut < n - 2, "cut {} of {n} summarises the waiting call", p.cut);
                }
                for i in p.cut..n {
                    if messages[i].role == Role::Tool {
                        let owner = caller(&messages, i);
                        prop_assert!(owner.is_some_and(|o| o >= p.cut),
                            "kept result {i} answers a summarised call {owner:?} (cut {})", p.cut);
                    }
                }
            }
            Err(PlanError::TooFewMessages(k)) => prop_assert!(k < 4 && k == n),
            Err(PlanError::NoCut | PlanError::CutAtEnd { .. }) => {
                // Without a window and from a low enough percentage every
                // index is tried: then only when no assistant message can
                // start the kept part.
                if window.is_none() && plan::normalized_percentage(percentage) <= 0.5 {
                    let max_cut = if plan::has_tool_calls(messages[n - 1]) { n - 2 } else { n - 1 };
                    let any = (1..max_cut).any(|i| messages[i].role == Role::Assistant);
                    prop_assert!(!any || n < 4, "a cut existed but none was found");
                }
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    #[test]
    fn all_keeps_exactly_what_waits_for_the_model(
        steps in steps(),
        stop in 0u8..4,
        reminders in 0usize..3,
    ) {
        let all = conversation(&steps, stop, reminders);
        let messages: Vec<&StoredMessage> = all.iter().collect();
        let n = messages.len() - reminders;
        let p = plan::all(&messages);
        let waiting = match stop {
            0 => 0,
            // The last turn's call (with or without its results) waits,
            // or, with no tool round, its user message.
            1 => 1,
            2 => if matches!(steps.last(), Some(Step::Turn { rounds: 0, .. })) { 1 } else { 2 },
            _ => 1,
        };
        prop_assert_eq!(p.cut, n - waiting, "stop {} reminders {}", stop, reminders);
        prop_assert!(n - p.cut <= 2);
        // What is kept waits: a user message, a call, or a call's results.
        for m in &messages[p.cut..n] {
            prop_assert!(m.role != Role::Assistant || plan::has_tool_calls(m));
        }
    }
}
