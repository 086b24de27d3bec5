//! A turn's rules: the user's words matched against the rules (a tool
//! call each), an integration turn, the question of what it knows, and the
//! reply to tool results.

use std::sync::{LazyLock, OnceLock};

use regex::Regex;
use serde_json::json;

use super::read::{Lang, between, clean_capture, is_reminder_only, last_user_text};
use super::response::next_call_id;
use crate::protocol::messages::{Message, Part};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    Run,
    Forget,
    Remember,
    Persona,
    Rename,
    Delegate,
    Recall,
    Commit,
}

/// `(rule, pattern, word)`: `word` is in the lower-cased text of every
/// match of `pattern`, so a text without it is not tried, and the pattern
/// is compiled only when some text has it (compiling all of them costs a
/// few milliseconds: the first turn of every supervisor paid it).
const RULE_PATTERNS: &[(Rule, &str, &str)] = &[
    (Rule::Run, r"(?i)^run:\s*(.+)", "run:"),
    (Rule::Forget, r"忘掉[:：]\s*(.+)", "忘掉"),
    (Rule::Forget, r"(?i)forget:\s*(.+)", "forget:"),
    (
        Rule::Rename,
        r"别再叫我\s*(.+?)\s*了[，,]\s*叫我\s*(.+)",
        "别再叫我",
    ),
    (
        Rule::Rename,
        r"(?i)don[’']?t call me\s+(.+?),?\s+call me\s+(.+)",
        "call me",
    ),
    (Rule::Recall, r"回忆[:：]\s*(.+)", "回忆"),
    (Rule::Recall, r"(?i)^recall:\s*(.+)", "recall:"),
    (Rule::Delegate, r"后台记住[:：]\s*(.+)", "后台记住"),
    (
        Rule::Delegate,
        r"(?i)in the background,?\s*remember:\s*(.+)",
        "remember:",
    ),
    (Rule::Remember, r"记住[:：]\s*(.+)", "记住"),
    (Rule::Remember, r"(?i)remember:\s*(.+)", "remember:"),
    (Rule::Persona, r"设定[:：]\s*(.+)", "设定"),
    (Rule::Commit, r"^提交记忆", "提交记忆"),
    (Rule::Commit, r"(?i)^commit (your )?memory", "commit"),
];

/// The compiled patterns, each made on first need.
static COMPILED: [OnceLock<Option<Regex>>; RULE_PATTERNS.len()] =
    [const { OnceLock::new() }; RULE_PATTERNS.len()];

/// The first pattern of `rule` (in priority order), when `text` may match it.
pub(crate) fn first_pattern(rule: Rule, text: &str) -> Option<&'static Regex> {
    let at = RULE_PATTERNS.iter().position(|(r, _, _)| *r == rule)?;
    let (_, pattern, word) = RULE_PATTERNS.get(at)?;
    if !text.to_lowercase().contains(word) {
        return None;
    }
    COMPILED
        .get(at)?
        .get_or_init(|| Regex::new(pattern).ok())
        .as_ref()
}

/// The rules that may match `text`, in priority order, compiled. Patterns
/// are constants (a unit test checks that all compile), so a failure drops
/// the rule, never panics.
pub(crate) fn rules_for(text: &str) -> Vec<(Rule, &'static Regex)> {
    let lower = text.to_lowercase();
    RULE_PATTERNS
        .iter()
        .zip(&COMPILED)
        .filter(|((_, _, word), _)| lower.contains(word))
        .filter_map(|((rule, pattern, _), slot)| {
            slot.get_or_init(|| Regex::new(pattern).ok())
                .as_ref()
                .map(|re| (*rule, re))
        })
        .collect()
}

pub(crate) fn answer_turn(system: &str, messages: &[Message]) -> Vec<Part> {
    let last = messages.iter().rev().find(|m| !is_reminder_only(m));
    if let Some(last) = last
        && last
            .parts
            .iter()
            .any(|p| matches!(p, Part::ToolResult { .. }))
    {
        return vec![Part::text(follow_up(
            last,
            Lang::of(&last_user_text(messages)),
        ))];
    }
    let text = last_user_text(messages);
    if let Some(parts) = integrate(&text) {
        return parts;
    }
    for (rule, re) in rules_for(&text) {
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
                // What memory already says is not written twice (a demo
                // run again would otherwise grow the same line each time).
                if known_facts(system, messages).contains(&x) {
                    return vec![Part::text(Lang::of(&text).say(
                        format!("我已经记得：{x}。"),
                        format!("I already remember that: {x}."),
                    ))];
                }
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
    if may_ask_about_me(&text) && ASK_ABOUT_ME.is_match(&text) {
        return vec![Part::text(what_i_know(system, messages, Lang::of(&text)))];
    }
    vec![Part::text(format!("mock: {text}"))]
}

/// Whether `text` has a word every question of [`ASK_ABOUT_ME`] has (the
/// pattern is compiled only then).
fn may_ask_about_me(text: &str) -> bool {
    text.contains("我") || text.to_lowercase().contains("about me")
}

static ASK_ABOUT_ME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"你(知道|记得)我(什么|些什么)|(?i)what do you (know|remember) about me")
        .unwrap_or_else(|e| unreachable!("constant pattern: {e}"))
});

/// The `- ` lines of the newest `<human>` block the model can see (the
/// system prompt's, or a later `<memory_update>`'s), as an answer.
fn what_i_know(system: &str, messages: &[Message], lang: Lang) -> String {
    let facts = known_facts(system, messages);
    if facts.is_empty() {
        lang.say(
            "我还不知道关于你的事。".into(),
            "I don't know anything about you yet.".into(),
        )
    } else {
        lang.say(
            format!("我记得：{}。", facts.join("；")),
            format!("I remember: {}.", facts.join("; ")),
        )
    }
}

/// The facts (`- ` lines) of the latest `<human>` block in view: the
/// system prompt's, or a newer one a message carries.
fn known_facts(system: &str, messages: &[Message]) -> Vec<String> {
    let texts = std::iter::once(system.to_string()).chain(messages.iter().flat_map(|m| {
        m.parts.iter().filter_map(|p| match p {
            Part::Text { text } => Some(text.clone()),
            _ => None,
        })
    }));
    let block = texts
        .filter_map(|t| between(&t, "<human>", "</human>").map(str::to_string))
        .next_back();
    block
        .iter()
        .flat_map(|b| b.lines())
        .filter_map(|l| l.trim().strip_prefix("- ").map(|f| f.trim().to_string()))
        .filter(|f| !f.is_empty())
        .collect()
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

/// The reply to a message of tool results, in `lang`.
pub(crate) fn follow_up(results: &Message, lang: Lang) -> String {
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
    let head = |text: &str| text.chars().take(200).collect::<String>();
    if let Some((_, text, _)) = results.iter().find(|r| r.2) {
        return lang.say(format!("操作失败：{text}"), format!("That failed: {text}"));
    }
    match results.first() {
        // Said only when the tool reports a commit, naming it: the reply
        // comes from what happened, not from a fixed string.
        Some(("memory", text, _)) if text.starts_with("Merged the reflection branch") => {
            let rev = text.rsplit('(').next().unwrap_or("").trim_end_matches(").");
            lang.say(
                format!("好的，已合并反思分支（提交 {rev}）。"),
                format!("OK, the reflection branch is merged (commit {rev})."),
            )
        }
        Some(("memory", text, _)) if text.starts_with("Memory worker") => lang.say(
            "好的，已交给后台记忆工作者处理。".into(),
            "OK, a background memory worker is on it.".into(),
        ),
        Some(("memory", text, _)) => match committed_revision(text) {
            Some(rev) => lang.say(
                format!("好的，已更新记忆（提交 {rev}）。"),
                format!("OK, memory updated (commit {rev})."),
            ),
            None => lang.say(
                format!("记忆没有变化：{}", head(text)),
                format!("Memory is unchanged: {}", head(text)),
            ),
        },
        Some((_, text, _)) => lang.say(
            format!("工具结果：{}", head(text)),
            format!("Tool result: {}", head(text)),
        ),
        None => lang.say("工具结果：".into(), "Tool result:".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::Role;
    #[test]
    fn every_rule_pattern_compiles_and_has_its_word() {
        let all: String = RULE_PATTERNS
            .iter()
            .map(|(_, _, w)| *w)
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(rules_for(&all).len(), RULE_PATTERNS.len());
        // A match always holds its rule's word, whatever the case.
        let said = [
            ("RUN: ls", Rule::Run),
            ("Forget: tea", Rule::Forget),
            ("Don't call me Al, call me Bo", Rule::Rename),
            ("RECALL: tea", Rule::Recall),
            ("In the background, Remember: x", Rule::Delegate),
            ("REMEMBER: x", Rule::Remember),
            ("Commit your memory", Rule::Commit),
            ("记住：茶", Rule::Remember),
        ];
        for (text, rule) in said {
            assert!(
                rules_for(text)
                    .iter()
                    .any(|(r, re)| *r == rule && re.is_match(text)),
                "{text}"
            );
        }
        assert!(rules_for("hello there").is_empty());
    }

    #[test]
    fn asked_what_it_knows_it_answers_from_the_newest_human_block() {
        let user = |t: &str| Message {
            role: Role::User,
            parts: vec![Part::text(t)],
        };
        let system = "SYS\n<human>\n<description>d</description>\n- 我住在杭州\n</human>\n";
        let answer = what_i_know(system, &[user("你知道我什么？")], Lang::Chinese);
        assert_eq!(answer, "我记得：我住在杭州。");
        // A later memory update replaces what the system prompt showed.
        let update = "<system-reminder><memory_update><human>\n- 我住在杭州\n- 我喜欢绿茶\n</human></memory_update></system-reminder>";
        let answer = what_i_know(
            system,
            &[user(update), user("what do you know about me?")],
            Lang::Chinese,
        );
        assert_eq!(answer, "我记得：我住在杭州；我喜欢绿茶。");
        assert_eq!(
            what_i_know("SYS", &[], Lang::Chinese),
            "我还不知道关于你的事。"
        );
        assert!(ASK_ABOUT_ME.is_match("What do you know about me?"));
        assert!(!ASK_ABOUT_ME.is_match("hello"));
    }
}
