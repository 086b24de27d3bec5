//! How a turn looks on a terminal — the one place for `chat -p`, the
//! interactive session and `attach` (live events and stored history alike).
//!
//! [`event`] turns a turn event into a [`Piece`]: the model's text, which
//! continues the current line, or one line of activity (`→` a tool call,
//! `←` its result, `·` anything else). [`message`] renders a stored message
//! as one line with the same words. A [`Printer`] writes pieces, reply text
//! to one stream and activity to the same or another one, and starts an
//! activity line on a fresh line when the text before it did not end one.
//! Everything a child or a model wrote is cleaned of control sequences
//! here.

use std::io::Write;

use serde_json::Value;

use super::super::terminal::clean;
use crate::protocol::messages::Part;
use crate::protocol::turn::TurnEvent;
use crate::store::conversation::StoredMessage;

/// What a clustered home's memory-change line adds.
pub const UNTIL_PUSHED: &str = " on this host; acknowledged only once the turn pushes it";

/// Longest argument summary of a tool call, in characters.
const ARGS_MAX: usize = 200;

/// How much of a turn is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// The reply, steps, reminders, memory updates, tool calls, failures
    /// and an abnormal end (`chat`).
    Brief,
    /// Everything (`attach`).
    Full,
}

/// Something to print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Model text: printed as it comes, continuing the current line.
    Text(String),
    /// One line of activity (no newline in it).
    Note(String),
    /// A turn's error (no newline in it): a note whose label is red where
    /// the CLI's other errors are.
    Error(String),
}

/// What a turn event shows, if anything.
pub fn event(e: &TurnEvent, detail: Detail) -> Option<Piece> {
    let full = detail == Detail::Full;
    let note = |s: String| Some(Piece::Note(s));
    match e {
        TurnEvent::TextDelta { text } => Some(Piece::Text(clean(text).into_owned())),
        TurnEvent::ToolCall {
            name, arguments, ..
        } => note(tool_call(name, arguments)),
        TurnEvent::ToolResult {
            name,
            text,
            is_error,
            ..
        } if full || *is_error => note(tool_result(name, text, *is_error)),
        TurnEvent::Retry {
            attempt,
            error,
            delay_ms,
        } => note(format!(
            "· retry {} {}: {}",
            attempt_of(*attempt),
            in_seconds(*delay_ms),
            first_line(error)
        )),
        TurnEvent::Waiting { reason } => note(format!("· {}", first_line(reason))),
        TurnEvent::Reflection { trigger, waits } => note(format!(
            "· reflecting in the background ({}){}",
            clean(trigger),
            if *waits {
                "; no supervisor is running, so this command waits for it before exiting"
            } else {
                ""
            }
        )),
        TurnEvent::Compaction {
            trigger,
            mode,
            messages_before,
            messages_after,
            tokens_before,
            tokens_after,
        } => note(format!(
            "· compacted ({}, {}): {messages_before} → {messages_after} messages, {tokens_before} → {tokens_after} tokens",
            clean(trigger),
            clean(mode)
        )),
        TurnEvent::Error { message, hint } => Some(Piece::Error(match hint {
            Some(h) => format!("{} (hint: {})", one_line(message), one_line(h)),
            None => one_line(message),
        })),
        TurnEvent::Done { stop_reason, .. } if stop_reason == "cancelled" => {
            note("· cancelled (the conversation records the interruption)".into())
        }
        TurnEvent::Done { stop_reason, .. } if stop_reason != "end_turn" => {
            note(format!("· stopped: {}", first_line(stop_reason)))
        }
        TurnEvent::Done { .. } if full => note("· done".into()),
        // Steps, reminders and memory updates are what the book's
        // transcripts show of a turn, in `chat` as in `attach`.
        TurnEvent::Step { n } => note(format!("· step {n}")),
        TurnEvent::Reminders { items } if !items.is_empty() => {
            note(format!("· reminders: {}", clean(&items.join(", "))))
        }
        TurnEvent::MemoryUpdate { revision } => note(match revision {
            Some(r) => format!("· memory changed (revision {})", clean(r)),
            None => "· memory changed".into(),
        }),
        _ => None,
    }
}

/// Whether a part is a harness reminder (not the user's own words).
fn is_reminder(p: &Part) -> bool {
    matches!(p, Part::Text { text } if text.starts_with("<system-reminder>"))
}

/// What a reminder is, in a few words: its title (`MEMORY COMMIT NEEDED`)
/// or `memory update`.
fn reminder_title(p: &Part) -> String {
    let Part::Text { text } = p else {
        return String::new();
    };
    let body = text.trim_start_matches("<system-reminder>").trim_start();
    if body.starts_with("<memory_update") {
        return "memory update".into();
    }
    let first = body.lines().next().unwrap_or_default();
    let title = first.split(':').next().unwrap_or_default().trim();
    clip(first_line(title), 60)
}

/// A stored message as one line: `[id] Role: what it holds`, system
/// reminders left out — or named, when they are all it holds (a turn that
/// carried only reminders).
pub fn message(m: &StoredMessage) -> String {
    if !m.parts.is_empty() && m.parts.iter().all(is_reminder) {
        let titles: Vec<String> = m.parts.iter().map(reminder_title).collect();
        return format!(
            "[{}] {:?}: (reminders only: {})",
            clean(&m.id),
            m.role,
            titles.join(", ")
        );
    }
    let parts: Vec<String> = m
        .parts
        .iter()
        .filter(|p| !is_reminder(p))
        .map(|p| match p {
            Part::Text { text } => clean(text).into_owned(),
            Part::ToolCall {
                name, arguments, ..
            } => tool_call(name, arguments),
            Part::ToolResult {
                name,
                text,
                is_error,
                ..
            } => tool_result(name, text, *is_error),
        })
        .collect();
    format!("[{}] {:?}: {}", clean(&m.id), m.role, parts.join(" | "))
}

/// `→ name what`: the call's command, path or query when it has one, else
/// its arguments as JSON; one line, clipped.
fn tool_call(name: &str, arguments: &Value) -> String {
    const KEYS: &[&str] = &["command", "file_path", "old_path", "new_path", "query"];
    let named: Vec<&str> = KEYS
        .iter()
        .filter_map(|k| arguments.get(*k).and_then(Value::as_str))
        .collect();
    let what = if named.is_empty() {
        arguments.to_string()
    } else {
        named.join(" ")
    };
    let what = clip(first_line(&what), ARGS_MAX);
    format!("→ {} {what}", clean(name)).trim_end().to_string()
}

/// `← name: first line`, `← name (error): first line`.
fn tool_result(name: &str, text: &str, is_error: bool) -> String {
    format!(
        "← {}{}: {}",
        clean(name),
        if is_error { " (error)" } else { "" },
        first_line(text)
    )
    .trim_end()
    .to_string()
}

/// All of `text` on one line, cleaned (an error's every line matters).
fn one_line(text: &str) -> String {
    clean(&text.split_whitespace().collect::<Vec<_>>().join(" ")).into_owned()
}

/// The first line of `text`, cleaned.
/// `2/4`: the retry's try of the most a turn makes.
fn attempt_of(attempt: u32) -> String {
    format!("{attempt}/{}", crate::agent::runtime::MAX_RETRIES)
}

/// `in 0.4 s`: when the retry goes out.
fn in_seconds(delay_ms: u64) -> String {
    format!("in {:.1} s", delay_ms as f64 / 1000.0)
}

fn first_line(text: &str) -> String {
    clean(text.lines().next().unwrap_or_default()).into_owned()
}

fn clip(s: String, max: usize) -> String {
    if s.chars().count() <= max {
        return s;
    }
    let cut: String = s.chars().take(max).collect();
    format!("{cut}…")
}

/// Writes pieces: text to `text`, activity lines to `notes` (or to `text`
/// when there is no second stream). A line of activity after text that
/// did not end its line first ends it.
pub struct Printer<T: Write, N: Write> {
    text: T,
    notes: Option<N>,
    mid_line: bool,
    /// Hold a model call's text until the call has ended: a call that is
    /// retried must not leave its text in a pipe (issue 48: a script read
    /// `fake \nfake reply …`). On a terminal text streams instead, and a
    /// retry says that the text above was not the answer.
    hold: bool,
    held: String,
    /// The home is in a cluster: a memory change is this host's until the
    /// turn's push, and the line says so (issue 43: a host that lost the
    /// agent streamed "memory changed", then "not acknowledged").
    clustered: bool,
}

impl<T: Write> Printer<T, T> {
    /// Text and activity on one stream.
    pub(crate) fn one_stream(out: T) -> Self {
        Self {
            text: out,
            notes: None,
            mid_line: false,
            hold: false,
            held: String::new(),
            clustered: false,
        }
    }
}

impl<T: Write, N: Write> Printer<T, N> {
    /// Text on `text`, activity on `notes`.
    pub(crate) fn two_streams(text: T, notes: N) -> Self {
        Self {
            text,
            notes: Some(notes),
            mid_line: false,
            hold: false,
            held: String::new(),
            clustered: false,
        }
    }

    /// Hold each model call's text until it has ended (text going to a
    /// pipe or a file, read by a script).
    pub fn holding(mut self, hold: bool) -> Self {
        self.hold = hold;
        self
    }

    /// Say of each memory change that it is acknowledged only once pushed.
    pub fn clustered(mut self, clustered: bool) -> Self {
        self.clustered = clustered;
        self
    }

    /// Print one piece.
    pub fn print(&mut self, piece: &Piece) -> std::io::Result<()> {
        match piece {
            Piece::Text(t) if t.is_empty() => Ok(()),
            Piece::Text(t) => {
                self.text.write_all(t.as_bytes())?;
                self.mid_line = !t.ends_with('\n');
                self.text.flush()
            }
            Piece::Note(line) => self.note_line(line),
            Piece::Error(message) => self.note_line(&format!(
                "· {} {message}",
                crate::console::style::error("error:")
            )),
        }
    }

    fn note_line(&mut self, line: &str) -> std::io::Result<()> {
        self.end_line()?;
        let out: &mut dyn Write = match &mut self.notes {
            Some(n) => n,
            None => &mut self.text,
        };
        writeln!(out, "{line}")?;
        out.flush()
    }

    /// Print what `e` shows at `detail`.
    pub fn event(&mut self, e: &TurnEvent, detail: Detail) -> std::io::Result<()> {
        match e {
            TurnEvent::TextDelta { text } if self.hold => {
                self.held.push_str(&clean(text));
                return Ok(());
            }
            TurnEvent::Retry {
                attempt,
                error,
                delay_ms,
            } => {
                // The call's text so far was not the answer.
                let shown = self.mid_line;
                self.held.clear();
                let why = first_line(error);
                let which = format!("{} {}", attempt_of(*attempt), in_seconds(*delay_ms));
                let line = if shown {
                    format!(
                        "· retry {which}: {why} (the text above was cut off; the answer follows)"
                    )
                } else {
                    format!("· retry {which}: {why}")
                };
                return self.print(&Piece::Note(line));
            }
            _ => {
                if !self.held.is_empty() {
                    let text = std::mem::take(&mut self.held);
                    self.print(&Piece::Text(text))?;
                }
            }
        }
        match (event(e, detail), e) {
            (Some(Piece::Note(line)), TurnEvent::MemoryUpdate { .. }) if self.clustered => {
                self.print(&Piece::Note(format!("{line}{UNTIL_PUSHED}")))
            }
            (Some(p), _) => self.print(&p),
            (None, _) => Ok(()),
        }
    }

    /// End the text's line if it is open (the end of a turn).
    pub fn end_line(&mut self) -> std::io::Result<()> {
        if self.mid_line {
            self.mid_line = false;
            self.text.write_all(b"\n")?;
            self.text.flush()?;
        }
        Ok(())
    }

    /// The streams back.
    #[cfg(test)]
    pub fn into_inner(self) -> (T, Option<N>) {
        (self.text, self.notes)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::messages::{Role, Usage};

    fn done(reason: &str) -> TurnEvent {
        TurnEvent::Done {
            stop_reason: reason.into(),
            text: String::new(),
            steps: 1,
            usage: Usage::default(),
        }
    }

    fn call(name: &str, arguments: Value) -> TurnEvent {
        TurnEvent::ToolCall {
            id: "c1".into(),
            name: name.into(),
            arguments,
        }
    }

    fn result(text: &str, is_error: bool) -> TurnEvent {
        TurnEvent::ToolResult {
            id: "c1".into(),
            name: "memory".into(),
            text: text.into(),
            is_error,
        }
    }

    fn note(s: &str) -> Option<Piece> {
        Some(Piece::Note(s.into()))
    }

    #[test]
    fn tool_calls_show_what_they_act_on() {
        for detail in [Detail::Brief, Detail::Full] {
            assert_eq!(
                event(
                    &call(
                        "Bash",
                        json!({"command": "ls -l\nrm x", "description": "d"})
                    ),
                    detail
                ),
                note("→ Bash ls -l")
            );
        }
        assert_eq!(
            event(
                &call(
                    "memory",
                    json!({"command": "insert", "file_path": "human.md", "reason": "r"})
                ),
                Detail::Brief
            ),
            note("→ memory insert human.md")
        );
        assert_eq!(
            event(&call("odd", json!({"n": 1})), Detail::Brief),
            note(r#"→ odd {"n":1}"#)
        );
        assert_eq!(
            event(&call("odd", json!({})), Detail::Brief),
            note("→ odd {}")
        );
        let long = "x".repeat(500);
        let Some(Piece::Note(line)) = event(&call("Bash", json!({"command": long})), Detail::Full)
        else {
            panic!("a tool call shows")
        };
        assert_eq!(
            line.chars().count(),
            "→ Bash ".chars().count() + ARGS_MAX + 1
        );
        assert!(line.ends_with("x…"));
    }

    #[test]
    fn brief_shows_the_turns_course_full_shows_everything() {
        let ok = result("Memory insert committed locally (abc1234).\nmore", false);
        let bad = result("No space left on device\ndetail", true);
        assert_eq!(event(&ok, Detail::Brief), None);
        assert_eq!(
            event(&ok, Detail::Full),
            note("← memory: Memory insert committed locally (abc1234).")
        );
        for d in [Detail::Brief, Detail::Full] {
            assert_eq!(
                event(&bad, d),
                note("← memory (error): No space left on device")
            );
            assert_eq!(event(&done("max_steps"), d), note("· stopped: max_steps"));
            assert_eq!(
                event(
                    &TurnEvent::Retry {
                        attempt: 2,
                        error: "transient model error (HTTP 503): busy".into(),
                        delay_ms: 400,
                    },
                    d
                ),
                note("· retry 2/3 in 0.4 s: transient model error (HTTP 503): busy")
            );
        }
        assert_eq!(event(&done("end_turn"), Detail::Brief), None);
        assert_eq!(event(&done("end_turn"), Detail::Full), note("· done"));
        let step = TurnEvent::Step { n: 3 };
        assert_eq!(event(&step, Detail::Brief), note("· step 3"));
        assert_eq!(event(&step, Detail::Full), note("· step 3"));
        let reminders = TurnEvent::Reminders {
            items: vec!["agent-info".into(), "memory-commit-needed".into()],
        };
        for d in [Detail::Brief, Detail::Full] {
            assert_eq!(
                event(&reminders, d),
                note("· reminders: agent-info, memory-commit-needed")
            );
        }
        let none = TurnEvent::Reminders { items: vec![] };
        assert_eq!(event(&none, Detail::Full), None);
        let update = TurnEvent::MemoryUpdate {
            revision: Some("3f0c1e2".into()),
        };
        for d in [Detail::Brief, Detail::Full] {
            assert_eq!(
                event(&update, d),
                note("· memory changed (revision 3f0c1e2)")
            );
        }
    }

    #[test]
    fn control_sequences_never_reach_the_terminal() {
        let text = TurnEvent::TextDelta {
            text: "hi\x1b]0;owned\x07 there\x1b[2J".into(),
        };
        let Some(Piece::Text(t)) = event(&text, Detail::Brief) else {
            panic!("text shows")
        };
        assert!(!t.contains('\x1b') && !t.contains('\x07'), "{t:?}");
        assert!(t.starts_with("hi") && t.contains("there"), "{t:?}");
        let Some(Piece::Note(n)) = event(&call("Ba\x1b[2Jsh", json!({})), Detail::Brief) else {
            panic!("a tool call shows")
        };
        assert!(!n.contains('\x1b'), "{n:?}");
    }

    /// A turn that carried only reminders showed as an empty `User:`
    /// line in `attach`; it says what it carried.
    #[test]
    fn a_reminder_only_message_says_what_it_carried() {
        let m = StoredMessage::new(
            "m9".into(),
            Role::User,
            vec![
                Part::text(
                    "<system-reminder>\nMEMORY COMMIT NEEDED: The memory repository has \
                     uncommitted changes.\n\nMemory directory: /x\n</system-reminder>",
                ),
                Part::text(
                    "<system-reminder>\n<memory_update>\n<human>\n- x\n</human>\n</memory_update>\n</system-reminder>",
                ),
            ],
        );
        assert_eq!(
            message(&m),
            "[m9] User: (reminders only: MEMORY COMMIT NEEDED, memory update)"
        );
        let hidden = StoredMessage::new(
            "m10".into(),
            Role::User,
            vec![Part::text(
                "<system-reminder>\n\x1b[2Jodd\n</system-reminder>",
            )],
        );
        let line = message(&hidden);
        assert!(
            !line.contains('\x1b') && line.contains("reminders only"),
            "{line:?}"
        );
    }

    #[test]
    fn stored_messages_read_like_live_events() {
        let m = StoredMessage::new(
            "m7".into(),
            Role::Assistant,
            vec![
                Part::text("<system-reminder>\nhidden\n</system-reminder>"),
                Part::text("On it."),
                Part::ToolCall {
                    id: "c1".into(),
                    name: "Bash".into(),
                    arguments: json!({"command": "date"}),
                },
            ],
        );
        assert_eq!(message(&m), "[m7] Assistant: On it. | → Bash date");
        let r = StoredMessage::new(
            "m8".into(),
            Role::Tool,
            vec![Part::ToolResult {
                call_id: "c1".into(),
                name: "Bash".into(),
                text: "boom\ntrace".into(),
                is_error: true,
            }],
        );
        assert_eq!(message(&r), "[m8] Tool: ← Bash (error): boom");
    }

    #[test]
    fn activity_starts_on_a_fresh_line() {
        let mut p = Printer::one_stream(Vec::new());
        let events = [
            TurnEvent::Step { n: 1 },
            TurnEvent::TextDelta {
                text: "Let me ".into(),
            },
            TurnEvent::TextDelta {
                text: "check.".into(),
            },
            call("Bash", json!({"command": "date"})),
            result("Tue", false),
            TurnEvent::TextDelta {
                text: "Done.\n".into(),
            },
            done("end_turn"),
        ];
        for e in &events {
            p.event(e, Detail::Full).unwrap_or_default();
        }
        p.end_line().unwrap_or_default();
        let (out, _) = p.into_inner();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "· step 1\nLet me check.\n→ Bash date\n← memory: Tue\nDone.\n· done\n"
        );
    }

    #[test]
    fn two_streams_keep_the_reply_apart() {
        let mut p = Printer::two_streams(Vec::new(), Vec::new());
        for e in [
            TurnEvent::TextDelta { text: "Hi".into() },
            call("Bash", json!({"command": "date"})),
            TurnEvent::TextDelta {
                text: " there".into(),
            },
            done("end_turn"),
        ] {
            p.event(&e, Detail::Brief).unwrap_or_default();
        }
        p.end_line().unwrap_or_default();
        let (out, notes) = p.into_inner();
        assert_eq!(String::from_utf8_lossy(&out), "Hi\n there\n");
        assert_eq!(
            String::from_utf8_lossy(&notes.unwrap_or_default()),
            "→ Bash date\n"
        );
    }

    #[test]
    fn a_retried_calls_text_is_held_back_from_a_pipe_and_disowned_on_a_terminal() {
        let events = [
            TurnEvent::TextDelta {
                text: "fake ".into(),
            },
            TurnEvent::Retry {
                attempt: 1,
                error: "stream cut".into(),
                delay_ms: 200,
            },
            TurnEvent::TextDelta {
                text: "the answer".into(),
            },
            done("end_turn"),
        ];
        let mut piped = Printer::two_streams(Vec::new(), Vec::new()).holding(true);
        for e in &events {
            piped.event(e, Detail::Brief).unwrap();
        }
        piped.end_line().unwrap();
        let (text, notes) = piped.into_inner();
        assert_eq!(String::from_utf8(text).unwrap(), "the answer\n");
        assert!(
            String::from_utf8(notes.unwrap())
                .unwrap()
                .contains("retry 1/3 in 0.2 s")
        );
        let mut terminal = Printer::two_streams(Vec::new(), Vec::new());
        for e in &events {
            terminal.event(e, Detail::Brief).unwrap();
        }
        let (text, notes) = terminal.into_inner();
        assert_eq!(String::from_utf8(text).unwrap(), "fake \nthe answer");
        assert!(
            String::from_utf8(notes.unwrap())
                .unwrap()
                .contains("the text above was cut off")
        );
    }
}
