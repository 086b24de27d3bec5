//! A compaction's summary: the facts a transcript's user entries carry,
//! or one line per message when the request is not a transcript.

use super::read::{message_text, role_name};
use crate::protocol::messages::{Message, Role, strip_reminders};

/// Most facts a mock summary keeps (the oldest first).
pub const SUMMARY_MAX_FACTS: usize = 8;
/// Longest fact line of a mock summary, in characters.
const SUMMARY_FACT_CHARS: usize = 80;
/// How a transcript entry starts (`agent::context::transcript`).
const TRANSCRIPT_ROLES: [&str; 3] = ["[user] ", "[assistant] ", "[tool] "];

/// The entries of a compaction transcript: `(role, text)`, a line that
/// starts with `[user] `, `[assistant] ` or `[tool] ` opening the next.
fn transcript_entries(text: &str) -> Vec<(&'static str, String)> {
    let mut entries: Vec<(&'static str, String)> = Vec::new();
    for line in text.lines() {
        if let Some(role) = TRANSCRIPT_ROLES.iter().find(|r| line.starts_with(**r)) {
            entries.push((role, line[role.len()..].to_string()));
        } else if let Some((_, body)) = entries.last_mut() {
            body.push('\n');
            body.push_str(line);
        }
    }
    entries
}

pub(crate) fn summarize(messages: &[Message]) -> String {
    let transcript: String = messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(message_text)
        .collect::<Vec<_>>()
        .join("\n");
    let entries = transcript_entries(&transcript);
    if entries.is_empty() {
        return summarize_messages(messages);
    }
    let mut facts: Vec<String> = Vec::new();
    let mut keep = |fact: &str| {
        let fact: String = fact.trim().chars().take(SUMMARY_FACT_CHARS).collect();
        if !fact.is_empty() && !facts.contains(&fact) {
            facts.push(fact);
        }
    };
    let users: Vec<String> = entries
        .iter()
        .filter(|(role, _)| *role == "[user] ")
        .map(|(_, body)| strip_reminders(body))
        .collect();
    for body in &users {
        for line in body.lines() {
            if let Some(fact) = line.trim().strip_prefix("- ") {
                keep(fact);
            }
        }
    }
    for body in &users {
        let first = body.lines().map(str::trim).find(|l| !l.is_empty());
        if let Some(line) = first
            && !line.starts_with("- ")
            && !line.starts_with("Summary of ")
        {
            keep(line);
        }
    }
    let mut out = format!("Summary of {} messages:", entries.len());
    for fact in facts.iter().take(SUMMARY_MAX_FACTS) {
        out.push_str("\n- ");
        out.push_str(fact);
    }
    out
}

/// A summary of plain messages (no transcript): one line each.
fn summarize_messages(messages: &[Message]) -> String {
    let mut out = format!("Summary of {} messages:", messages.len());
    for m in messages {
        let text = message_text(m);
        let first: String = text.lines().next().unwrap_or("").chars().take(80).collect();
        out.push('\n');
        out.push_str(&format!("[{}] {first}", role_name(m.role)));
    }
    out
}
