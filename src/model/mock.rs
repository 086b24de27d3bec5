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

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use regex::Regex;
use serde_json::{Value, json};

use crate::protocol::messages::strip_reminders;

use super::{
    Message, Model, ModelError, ModelEvent, ModelRequest, ModelResponse, Part, Purpose, Role,
    StopKind, Usage,
};

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

// ---------------------------------------------------------------------------
// Rules

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Run,
    Forget,
    Remember,
    Persona,
    Rename,
    Delegate,
    Recall,
    Commit,
}

const RULE_PATTERNS: &[(Rule, &str)] = &[
    (Rule::Run, r"(?i)^run:\s*(.+)"),
    (Rule::Forget, r"忘掉[:：]\s*(.+)"),
    (Rule::Forget, r"(?i)forget:\s*(.+)"),
    (Rule::Rename, r"别再叫我\s*(.+?)\s*了[，,]\s*叫我\s*(.+)"),
    (
        Rule::Rename,
        r"(?i)don[’']?t call me\s+(.+?),?\s+call me\s+(.+)",
    ),
    (Rule::Recall, r"回忆[:：]\s*(.+)"),
    (Rule::Recall, r"(?i)^recall:\s*(.+)"),
    (Rule::Delegate, r"后台记住[:：]\s*(.+)"),
    (
        Rule::Delegate,
        r"(?i)in the background,?\s*remember:\s*(.+)",
    ),
    (Rule::Remember, r"记住[:：]\s*(.+)"),
    (Rule::Remember, r"(?i)remember:\s*(.+)"),
    (Rule::Persona, r"设定[:：]\s*(.+)"),
    (Rule::Commit, r"^提交记忆"),
    (Rule::Commit, r"(?i)^commit (your )?memory"),
];

/// Compiled rules, in priority order. Patterns are constants (a unit test
/// checks that all compile), so a failure here drops the rule, never panics.
static RULES: LazyLock<Vec<(Rule, Regex)>> = LazyLock::new(|| {
    RULE_PATTERNS
        .iter()
        .filter_map(|(r, p)| Regex::new(p).ok().map(|re| (*r, re)))
        .collect()
});

/// The user's own words: the last text part, not only reminders, of the
/// last user message that has one, trimmed.
pub fn last_user_text(messages: &[Message]) -> String {
    messages
        .iter()
        .rev()
        .filter(|m| m.role == Role::User)
        .find_map(|m| {
            m.parts.iter().rev().find_map(|p| match p {
                Part::Text { text } => {
                    let s = strip_reminders(text);
                    let s = s.trim();
                    (!s.is_empty()).then(|| s.to_string())
                }
                _ => None,
            })
        })
        .unwrap_or_default()
}

/// A user message carrying nothing but `<system-reminder>` blocks (the
/// runtime may send one after tool results).
fn is_reminder_only(m: &Message) -> bool {
    m.role == Role::User
        && m.parts.iter().all(|p| match p {
            Part::Text { text } => strip_reminders(text).trim().is_empty(),
            _ => false,
        })
}

fn clean_capture(s: &str) -> String {
    s.trim()
        .trim_end_matches(['。', '.', '!', '！'])
        .trim()
        .to_string()
}

fn answer_turn(system: &str, messages: &[Message]) -> Vec<Part> {
    let last = messages.iter().rev().find(|m| !is_reminder_only(m));
    if let Some(last) = last
        && last
            .parts
            .iter()
            .any(|p| matches!(p, Part::ToolResult { .. }))
    {
        return vec![Part::text(follow_up(last))];
    }
    let text = last_user_text(messages);
    if let Some(parts) = integrate(&text) {
        return parts;
    }
    for (rule, re) in RULES.iter() {
        let Some(c) = re.captures(&text) else {
            continue;
        };
        let group = |i: usize| c.get(i).map(|m| m.as_str()).unwrap_or("");
        let (name, args) = match rule {
            Rule::Run => {
                let cmd = group(1).trim();
                (
                    "Bash",
                    json!({"command": cmd, "description": format!("run {cmd}")}),
                )
            }
            Rule::Forget => {
                let x = clean_capture(group(1));
                (
                    "memory",
                    json!({"command": "str_replace", "file_path": "human.md",
                           "old_string": x, "new_string": "", "reason": format!("forget: {x}")}),
                )
            }
            Rule::Remember => {
                let x = clean_capture(group(1));
                (
                    "memory",
                    json!({"command": "insert", "file_path": "human.md",
                           "insert_text": format!("- {x}"), "reason": format!("remember: {x}")}),
                )
            }
            Rule::Persona => {
                let x = clean_capture(group(1));
                (
                    "memory",
                    json!({"command": "insert", "file_path": "persona.md",
                           "insert_text": format!("- {x}"), "reason": format!("persona: {x}")}),
                )
            }
            Rule::Recall => {
                let x = clean_capture(group(1));
                ("recall_search", json!({"query": x, "subagent": true}))
            }
            Rule::Delegate => {
                let x = clean_capture(group(1));
                (
                    "memory",
                    json!({"command": "delegate", "instruction": format!("记住: {x}"),
                           "reason": format!("delegate: remember {x}")}),
                )
            }
            Rule::Commit => (
                "memory",
                json!({"command": "commit", "reason": "commit the pending memory edits"}),
            ),
            Rule::Rename => {
                let (x, y) = (clean_capture(group(1)), clean_capture(group(2)));
                (
                    "memory",
                    json!({"command": "str_replace", "file_path": "human.md",
                           "old_string": x, "new_string": y, "reason": format!("rename: {x} -> {y}")}),
                )
            }
        };
        return vec![Part::ToolCall {
            id: next_call_id(),
            name: name.to_string(),
            arguments: args,
        }];
    }
    if ASK_ABOUT_ME.is_match(&text) {
        return vec![Part::text(what_i_know(system, messages))];
    }
    vec![Part::text(format!("mock: {text}"))]
}

static ASK_ABOUT_ME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"你(知道|记得)我(什么|些什么)|(?i)what do you (know|remember) about me")
        .unwrap_or_else(|e| unreachable!("constant pattern: {e}"))
});

/// The `- ` lines of the newest `<human>` block the model can see (the
/// system prompt's, or a later `<memory_update>`'s), as an answer.
fn what_i_know(system: &str, messages: &[Message]) -> String {
    let texts = std::iter::once(system.to_string()).chain(messages.iter().flat_map(|m| {
        m.parts.iter().filter_map(|p| match p {
            Part::Text { text } => Some(text.clone()),
            _ => None,
        })
    }));
    let block = texts
        .filter_map(|t| between(&t, "<human>", "</human>").map(str::to_string))
        .next_back();
    let facts: Vec<String> = block
        .iter()
        .flat_map(|b| b.lines())
        .filter_map(|l| l.trim().strip_prefix("- ").map(|f| f.trim().to_string()))
        .filter(|f| !f.is_empty())
        .collect();
    if facts.is_empty() {
        "我还不知道关于你的事。".to_string()
    } else {
        format!("我记得：{}。", facts.join("；"))
    }
}

/// An integration turn (the explicit merge mode): merge the reflection's
/// branch, unless the merge instructions say not to.
fn integrate(text: &str) -> Option<Vec<Part>> {
    let block = between(
        text,
        "<reflection-integration branch=\"",
        "</reflection-integration>",
    )?;
    let branch = block.split('"').next().unwrap_or("").to_string();
    let instructions = between(
        block,
        "<reflection-merge-instructions>",
        "</reflection-merge-instructions>",
    )
    .unwrap_or("")
    .to_lowercase();
    if instructions.contains("do not merge") || instructions.contains("不要合并") {
        return Some(vec![Part::text(
            "不合并：合并说明要求不要合并这个反思提议。".to_string(),
        )]);
    }
    Some(vec![Part::ToolCall {
        id: next_call_id(),
        name: "memory".into(),
        arguments: json!({"command": "merge", "branch": branch, "reason": "merge the reviewed reflection"}),
    }])
}

/// The short revision in a memory tool result such as `Memory insert
/// committed locally (abc1234).`
fn committed_revision(text: &str) -> Option<&str> {
    let rest = text.split(" committed").nth(1)?;
    let inner = rest.split('(').nth(1)?.split(')').next()?;
    (!inner.is_empty() && inner.chars().all(|c| c.is_ascii_hexdigit())).then_some(inner)
}

/// The reply to a message of tool results.
fn follow_up(results: &Message) -> String {
    let results: Vec<(&str, &str, bool)> = results
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::ToolResult {
                name,
                text,
                is_error,
                ..
            } => Some((name.as_str(), text.as_str(), *is_error)),
            _ => None,
        })
        .collect();
    if let Some((_, text, _)) = results.iter().find(|r| r.2) {
        return format!("操作失败：{text}");
    }
    match results.first() {
        // Said only when the tool reports a commit, naming it: the reply
        // comes from what happened, not from a fixed string.
        Some(("memory", text, _)) if text.starts_with("Merged the reflection branch") => {
            let rev = text.rsplit('(').next().unwrap_or("").trim_end_matches(").");
            format!("好的，已合并反思分支（提交 {rev}）。")
        }
        Some(("memory", text, _)) if text.starts_with("Memory worker") => {
            "好的，已交给后台记忆工作者处理。".to_string()
        }
        Some(("memory", text, _)) => match committed_revision(text) {
            Some(rev) => format!("好的，已更新记忆（提交 {rev}）。"),
            None => format!(
                "记忆没有变化：{}",
                text.chars().take(200).collect::<String>()
            ),
        },
        Some((_, text, _)) => format!("工具结果：{}", text.chars().take(200).collect::<String>()),
        None => "工具结果：".to_string(),
    }
}

// ---------------------------------------------------------------------------
// Summary and reflection

/// The text of a message as the summary and reflection rules read it.
fn message_text(m: &Message) -> String {
    let pieces: Vec<String> = m
        .parts
        .iter()
        .map(|p| match p {
            Part::Text { text } => strip_reminders(text).trim().to_string(),
            Part::ToolCall {
                name, arguments, ..
            } => format!("{name} {arguments}"),
            Part::ToolResult { name, text, .. } => format!("{name}: {text}"),
        })
        .filter(|s| !s.is_empty())
        .collect();
    pieces.join("\n")
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

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

fn summarize(messages: &[Message]) -> String {
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

const REFLECTION_MARKER: &str = "Additional user-provided reflection instruction";

fn reflect(messages: &[Message]) -> String {
    let texts: Vec<String> = messages.iter().map(message_text).collect();
    let all = texts.join("\n");
    let lines: Vec<&str> = all.lines().collect();
    let instruction = lines
        .iter()
        .position(|l| l.contains(REFLECTION_MARKER))
        .and_then(|i| {
            lines[i + 1..]
                .iter()
                .map(|l| l.trim())
                .find(|l| !l.is_empty())
        })
        .map(str::to_string);
    let keywords = instruction.as_deref().map(keywords).unwrap_or_default();
    let mut facts: Vec<&str> = Vec::new();
    for l in &lines {
        let t = l.trim();
        let Some(fact) = t.strip_prefix("- ") else {
            continue;
        };
        if Some(t) == instruction.as_deref() || facts.contains(&fact) {
            continue;
        }
        let lower = fact.to_lowercase();
        if keywords.is_empty() || keywords.iter().any(|k| lower.contains(k.as_str())) {
            facts.push(fact);
        }
    }
    let mut out = format!(
        "Reflection instruction: {}\nKeywords: {}\n",
        instruction.as_deref().unwrap_or("(none)"),
        keywords.join(", ")
    );
    if facts.is_empty() {
        out.push_str("Matching facts: (none)");
    } else {
        out.push_str("Matching facts:");
        for f in facts {
            out.push_str("\n- ");
            out.push_str(f);
        }
    }
    out
}

/// A reflection (or memory worker) offered the `memory` tool: the first
/// request edits memory, the follow-up reports. See the module doc.
fn reflect_with_tools(messages: &[Message]) -> Vec<Part> {
    let last = messages.iter().rev().find(|m| !is_reminder_only(m));
    if let Some(last) = last
        && last
            .parts
            .iter()
            .any(|p| matches!(p, Part::ToolResult { .. }))
    {
        let mut report = plan_report(&reflection_plan(&task_text(messages)));
        report.push('\n');
        report.push_str(&follow_up(last));
        return vec![Part::text(report)];
    }
    let plan = reflection_plan(&task_text(messages));
    let Some(call) = plan.call() else {
        return vec![Part::text(format!(
            "{}\nNo memory changes were needed.",
            plan_report(&plan)
        ))];
    };
    vec![Part::ToolCall {
        id: next_call_id(),
        name: "memory".into(),
        arguments: call,
    }]
}

/// A recall sub-agent: search for the `<recall_request>`, then answer
/// with the hits (at most five lines).
fn recall_with_tools(messages: &[Message]) -> Vec<Part> {
    let last = messages.iter().rev().find(|m| !is_reminder_only(m));
    if let Some(last) = last {
        let results: Vec<&str> = last
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::ToolResult { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        if !results.is_empty() {
            let lines: Vec<&str> = results.iter().flat_map(|t| t.lines()).take(5).collect();
            return vec![Part::text(format!(
                "Recall findings:\n{}",
                lines.join("\n")
            ))];
        }
    }
    let query = between(
        &task_text(messages),
        "<recall_request>",
        "</recall_request>",
    )
    .map(str::trim)
    .unwrap_or("")
    .to_string();
    vec![Part::ToolCall {
        id: next_call_id(),
        name: "recall_search".into(),
        arguments: json!({ "query": query }),
    }]
}

/// The task a sub-agent was given: its user messages' text.
fn task_text(messages: &[Message]) -> String {
    messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(message_text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The report of a mock reflection: what it found to keep.
fn plan_report(plan: &ReflectionPlan) -> String {
    let mut out = String::from("Reflection report");
    match &plan.rename {
        Some((x, y)) => out.push_str(&format!("\nRename: {x} -> {y}")),
        None if plan.facts.is_empty() => out.push_str("\nNew facts: (none)"),
        None => {
            out.push_str("\nNew facts:");
            for f in &plan.facts {
                out.push_str("\n- ");
                out.push_str(f);
            }
        }
    }
    out
}

/// What a mock reflection changes: facts to add to `human.md`, or one
/// rename to make in it.
#[derive(Debug, Default, PartialEq, Eq)]
struct ReflectionPlan {
    facts: Vec<String>,
    rename: Option<(String, String)>,
}

impl ReflectionPlan {
    /// The memory tool call carrying the plan: a rename is an edit in
    /// place (never an appended line); otherwise the facts are inserted.
    fn call(&self) -> Option<Value> {
        if let Some((x, y)) = &self.rename {
            return Some(json!({"command": "str_replace", "file_path": "human.md",
                "old_string": x, "new_string": y,
                "reason": format!("reflection: call the user {y}, not {x}")}));
        }
        if self.facts.is_empty() {
            return None;
        }
        let text = self
            .facts
            .iter()
            .map(|f| format!("- {f}"))
            .collect::<Vec<_>>()
            .join("\n");
        Some(json!({"command": "insert", "file_path": "human.md",
            "insert_text": text,
            "reason": format!("reflection: {} fact(s) from the transcript", self.facts.len())}))
    }
}

/// Statements about the user worth keeping (first person, not a question).
static FACT_LINE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(?i)^(我(叫|是|喜欢|不喜欢|爱|住|在|有|的|会|想|每天|最)|i am |i'm |i like |i love |i live |i work |i have |my )").ok()
});

/// Read the reflection task: the instruction's keywords, the parent memory
/// (what is already captured), and the transcript's user lines.
fn reflection_plan(prompt: &str) -> ReflectionPlan {
    let lines: Vec<&str> = prompt.lines().collect();
    let instruction = lines
        .iter()
        .position(|l| l.contains(REFLECTION_MARKER))
        .and_then(|i| {
            lines[i + 1..]
                .iter()
                .map(|l| l.trim())
                .find(|l| !l.is_empty())
        });
    let keywords = instruction.map(keywords).unwrap_or_default();
    let memory = between(prompt, "<parent_memory>", "</parent_memory>").unwrap_or("");
    // A memory worker's assignment is said to it directly; a reflection
    // reads what the user said in the transcripts.
    let request: Vec<String> = between(prompt, "<memory_request>", "</memory_request>")
        // Indented lines (a quoted patch's context) are not asked for.
        .map(|r| {
            r.lines()
                .filter(|l| !l.starts_with(char::is_whitespace))
                .map(|l| format!("[user] {}", l.trim()))
                .collect()
        })
        .unwrap_or_default();
    let said_lines: Vec<&str> = if request.is_empty() {
        lines.clone()
    } else {
        request.iter().map(String::as_str).collect()
    };
    let mut plan = ReflectionPlan::default();
    for line in &said_lines {
        let Some(said) = line.trim().strip_prefix("[user] ") else {
            continue;
        };
        let said = strip_reminders(said);
        let said = said.trim();
        if let Some(c) = RULES
            .iter()
            .find(|(r, _)| *r == Rule::Rename)
            .and_then(|(_, re)| re.captures(said))
        {
            let group = |i: usize| clean_capture(c.get(i).map(|m| m.as_str()).unwrap_or(""));
            let (x, y) = (group(1), group(2));
            if !x.is_empty() && memory.contains(&x) {
                plan.rename = Some((x, y));
            }
            continue;
        }
        // A worker is asked to remember; in a transcript the main agent
        // already acted on such commands, so they are not facts there.
        let asked = RULES
            .iter()
            .find(|(r, re)| *r == Rule::Remember && re.is_match(said))
            .and_then(|(_, re)| re.captures(said))
            .and_then(|c| c.get(1))
            .map(|m| clean_capture(m.as_str()));
        if let Some(x) = asked.filter(|_| !request.is_empty()) {
            if !x.is_empty() && !memory.contains(&x) && !plan.facts.contains(&x) {
                plan.facts.push(x);
            }
            continue;
        }
        if RULES.iter().any(|(_, re)| re.is_match(said)) {
            continue;
        }
        let candidate = match said.strip_prefix("- ") {
            Some(f) => clean_capture(f),
            None if FACT_LINE.as_ref().is_some_and(|re| re.is_match(said))
                && !said.ends_with(['?', '？', '吗']) =>
            {
                clean_capture(said)
            }
            None => continue,
        };
        let lower = candidate.to_lowercase();
        let wanted = keywords.is_empty() || keywords.iter().any(|k| lower.contains(k.as_str()));
        if candidate.is_empty()
            || !wanted
            || memory.contains(&candidate)
            || plan.facts.contains(&candidate)
        {
            continue;
        }
        plan.facts.push(candidate);
    }
    plan
}

/// The text between the first `open` and the next `close`.
fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = text[start..].find(close)? + start;
    Some(&text[start..end])
}

/// Instruction words that say how to filter, not what to keep.
const STOPWORDS: &[&str] = &[
    "only",
    "keep",
    "fact",
    "facts",
    "about",
    "the",
    "and",
    "for",
    "with",
    "that",
    "this",
    "those",
    "these",
    "related",
    "relevant",
    "things",
    "anything",
    "everything",
    "information",
    "user",
    "remember",
    "record",
    "store",
    "save",
    "any",
    "all",
    "from",
    "into",
    "are",
    "is",
    "事",
];
/// Chinese function words that separate keywords in an unspaced instruction
/// (the instruction's own verbs and fillers among them: `只记住和茶有关的事`
/// asks for 茶).
const CJK_SEPARATORS: &[&str] = &[
    "相关", "有关", "关于", "事实", "事情", "记录", "记住", "记得", "记下", "保留", "东西", "信息",
    "内容", "用户", "所有", "一些", "只", "的", "与", "和", "及", "或", "请", "我",
];

/// Whether `c` is a Han character (one is a word: 茶, 猫).
fn is_han(c: char) -> bool {
    matches!(c, '\u{3400}'..='\u{4dbf}' | '\u{4e00}'..='\u{9fff}' | '\u{f900}'..='\u{faff}')
}

/// Keywords of a reflection instruction (see the module doc).
pub fn keywords(instruction: &str) -> Vec<String> {
    let mut text = instruction.to_lowercase();
    for sep in CJK_SEPARATORS {
        text = text.replace(sep, " ");
    }
    let mut out: Vec<String> = Vec::new();
    for w in text.split(|c: char| !c.is_alphanumeric()) {
        let w = w.to_string();
        let n = w.chars().count();
        let long_enough = if w.is_ascii() {
            n >= 3
        } else {
            n >= 2 || w.chars().all(is_han)
        };
        if long_enough && !STOPWORDS.contains(&w.as_str()) && !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Accounting, ids, streaming (shared with the scripted mode)

/// Characters of a request as the mock counts them: the system prompt, the
/// JSON of the tool specs, every text and tool-result text, and each tool
/// call's name and JSON arguments.
pub fn request_chars(request: &ModelRequest) -> usize {
    let tools = if request.tools.is_empty() {
        0
    } else {
        serde_json::to_string(&request.tools)
            .map(|s| s.chars().count())
            .unwrap_or(0)
    };
    request.system.chars().count()
        + tools
        + request
            .messages
            .iter()
            .flat_map(|m| m.parts.iter())
            .map(part_chars)
            .sum::<usize>()
}

/// Characters of one part (see [`request_chars`]).
pub fn part_chars(part: &Part) -> usize {
    match part {
        Part::Text { text } => text.chars().count(),
        Part::ToolCall {
            name, arguments, ..
        } => name.chars().count() + arguments_text(arguments).chars().count(),
        Part::ToolResult { text, .. } => text.chars().count(),
    }
}

fn arguments_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `ceil(chars / 4)`.
pub fn tokens(chars: usize) -> u64 {
    (chars as u64).div_ceil(4)
}

static COUNTER: AtomicU64 = AtomicU64::new(1);
static NONCE: LazyLock<String> = LazyLock::new(|| {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}{:x}", std::process::id(), nanos & 0xffff)
});

fn next_n() -> u64 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A fresh response id (`mock-resp-<process nonce>-<n>`).
pub fn next_response_id() -> String {
    format!("mock-resp-{}-{}", *NONCE, next_n())
}

/// A fresh tool-call id (`call_<process nonce>_<n>`).
pub fn next_call_id() -> String {
    format!("call_{}_{}", *NONCE, next_n())
}

/// Streams `parts` (text in small deltas, each tool call as one event) and
/// builds the response with usage computed from the characters.
pub(crate) fn finish(
    parts: Vec<Part>,
    input_tokens: u64,
    stop: Option<StopKind>,
    model: &str,
    on_event: &mut dyn FnMut(ModelEvent),
) -> ModelResponse {
    let mut has_tool = false;
    for p in &parts {
        match p {
            Part::Text { text } => {
                let chars: Vec<char> = text.chars().collect();
                for chunk in chars.chunks(24) {
                    on_event(ModelEvent::TextDelta {
                        text: chunk.iter().collect(),
                    });
                }
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                has_tool = true;
                on_event(ModelEvent::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                });
            }
            Part::ToolResult { .. } => {}
        }
    }
    let output_chars: usize = parts.iter().map(part_chars).sum();
    let stop = stop.unwrap_or(if has_tool {
        StopKind::ToolUse
    } else {
        StopKind::EndTurn
    });
    ModelResponse {
        parts,
        usage: Usage {
            input_tokens,
            output_tokens: tokens(output_chars),
            ..Usage::default()
        },
        stop,
        response_id: next_response_id(),
        model: model.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_pattern_compiles() {
        assert_eq!(RULES.len(), RULE_PATTERNS.len());
    }

    #[test]
    fn keywords_split_and_filter() {
        assert_eq!(
            keywords("Only keep facts about Rust, Editors"),
            vec!["rust", "editors"]
        );
        assert_eq!(keywords("只记录与编程相关的事实"), vec!["编程"]);
        // One Han character is a word; the instruction's own verbs are not.
        assert_eq!(keywords("只记住和茶有关的事"), vec!["茶"]);
        assert_eq!(keywords("请记住我喜欢的东西"), vec!["喜欢"]);
    }

    #[test]
    fn a_chinese_instruction_keeps_only_what_it_names() {
        let plan = reflection_plan(&task(
            "- 我住在杭州",
            &[
                "[user] 我喜欢绿茶",
                "[user] 我养了一只猫",
                "[user] 我每天早上喝一杯乌龙茶",
            ],
            Some("只记住和茶有关的事"),
        ));
        assert_eq!(plan.facts, vec!["我喜欢绿茶", "我每天早上喝一杯乌龙茶"]);
    }

    fn task(memory: &str, transcript: &[&str], instruction: Option<&str>) -> String {
        let mut t = format!(
            "<parent_memory>\n{memory}\n</parent_memory>\n<transcript conversation_id=\"default\">\n"
        );
        for l in transcript {
            t.push_str(l);
            t.push('\n');
        }
        t.push_str("</transcript>\n");
        if let Some(i) = instruction {
            t.push_str(&format!("{REFLECTION_MARKER}:\n{i}\n"));
        }
        t
    }

    #[test]
    fn a_reflection_promotes_new_first_person_facts_only() {
        let plan = reflection_plan(&task(
            "- 我喜欢咖啡",
            &[
                "[user] 我喜欢咖啡",
                "[user] 我住在杭州。",
                "[assistant] 我是助手",
                "[user] 我喜欢什么？",
                "[user] 记住: 我养猫",
                "[user] I work on compilers",
            ],
            None,
        ));
        assert_eq!(plan.facts, vec!["我住在杭州", "I work on compilers"]);
        assert_eq!(plan.rename, None);
        let call = plan.call().unwrap();
        assert_eq!(call["command"], "insert");
        assert_eq!(call["insert_text"], "- 我住在杭州\n- I work on compilers");
    }

    #[test]
    fn an_instruction_filters_by_keyword() {
        let plan = reflection_plan(&task(
            "",
            &["[user] I like Rust", "[user] I like tea"],
            Some("Only keep facts about Rust"),
        ));
        assert_eq!(plan.facts, vec!["I like Rust"]);
    }

    #[test]
    fn a_rename_is_an_edit_not_an_append() {
        let plan = reflection_plan(&task(
            "- 称呼: 小明",
            &["[user] 别再叫我 小明 了，叫我 阿明"],
            None,
        ));
        assert_eq!(plan.rename, Some(("小明".into(), "阿明".into())));
        let call = plan.call().unwrap();
        assert_eq!(call["command"], "str_replace");
        assert_eq!(call["old_string"], "小明");
        assert_eq!(call["new_string"], "阿明");
    }

    #[test]
    fn asked_what_it_knows_it_answers_from_the_newest_human_block() {
        let user = |t: &str| Message {
            role: Role::User,
            parts: vec![Part::text(t)],
        };
        let system = "SYS\n<human>\n<description>d</description>\n- 我住在杭州\n</human>\n";
        let answer = what_i_know(system, &[user("你知道我什么？")]);
        assert_eq!(answer, "我记得：我住在杭州。");
        // A later memory update replaces what the system prompt showed.
        let update = "<system-reminder><memory_update><human>\n- 我住在杭州\n- 我喜欢绿茶\n</human></memory_update></system-reminder>";
        let answer = what_i_know(system, &[user(update), user("what do you know about me?")]);
        assert_eq!(answer, "我记得：我住在杭州；我喜欢绿茶。");
        assert_eq!(what_i_know("SYS", &[]), "我还不知道关于你的事。");
        assert!(ASK_ABOUT_ME.is_match("What do you know about me?"));
        assert!(!ASK_ABOUT_ME.is_match("hello"));
    }

    #[test]
    fn nothing_new_means_no_call() {
        let plan = reflection_plan(&task("- 我住在杭州", &["[user] 我住在杭州"], None));
        assert_eq!(plan, ReflectionPlan::default());
        assert!(plan.call().is_none());
    }

    #[test]
    fn a_worker_remembers_what_it_is_asked() {
        let prompt = "<memory_request>\n记住: 我养了一只猫\n</memory_request>\n<parent_memory>\n- 我住在杭州\n</parent_memory>";
        let plan = reflection_plan(prompt);
        assert_eq!(plan.facts, vec!["我养了一只猫"]);
        let again = "<memory_request>\n记住: 我住在杭州\n</memory_request>\n<parent_memory>\n- 我住在杭州\n</parent_memory>";
        assert!(reflection_plan(again).call().is_none());
    }
}
