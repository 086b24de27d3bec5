//! A sub-agent's answers: a reflection's report without tools; with the
//! `memory` tool, the edits a reflection or memory worker plans and its
//! report after them; a recall sub-agent's search and findings.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Value, json};

use super::read::{Lang, between, clean_capture, is_reminder_only, message_text, task_text};
use super::response::next_call_id;
use super::turn::{Rule, first_pattern, follow_up, rules_for};
use crate::protocol::messages::{Message, Part, strip_reminders};

const REFLECTION_MARKER: &str = "Additional user-provided reflection instruction";

pub(crate) fn reflect(messages: &[Message]) -> String {
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
pub(crate) fn reflect_with_tools(messages: &[Message]) -> Vec<Part> {
    let last = messages.iter().rev().find(|m| !is_reminder_only(m));
    if let Some(last) = last
        && last
            .parts
            .iter()
            .any(|p| matches!(p, Part::ToolResult { .. }))
    {
        let mut report = plan_report(&reflection_plan(&task_text(messages)));
        report.push('\n');
        // The harness speaks to a sub-agent in English; the user's words
        // in its transcript decide the reply's language.
        report.push_str(&follow_up(last, Lang::of(&task_text(messages))));
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
pub(crate) fn recall_with_tools(messages: &[Message]) -> Vec<Part> {
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
        let rules = rules_for(said);
        if let Some(c) = first_pattern(Rule::Rename, said).and_then(|re| re.captures(said)) {
            let group = |i: usize| clean_capture(c.get(i).map(|m| m.as_str()).unwrap_or(""));
            let (x, y) = (group(1), group(2));
            if !x.is_empty() && memory.contains(&x) {
                plan.rename = Some((x, y));
            }
            continue;
        }
        // A worker is asked to remember; in a transcript the main agent
        // already acted on such commands, so they are not facts there.
        let asked = rules
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
        if rules.iter().any(|(_, re)| re.is_match(said)) {
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

#[cfg(test)]
mod tests {
    use super::*;
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
