//! Every instruction names only what its receiver can do (issue 31 §2).
//!
//! The agent and its sub-agents are told to act — by reminders, by the
//! prompts a sub-agent starts with — and an instruction whose tool or
//! command the role does not have sends the model after something that
//! fails in its sandbox (a `wc -c` for a reflector that has no shell; a git
//! recipe for an agent whose `memory.git` is read-only). [`unavailable`]
//! reads a text for what it names: a tool (backticked, next to "tool", or a
//! capitalised tool name inside a sentence), a program in a backticked
//! command line, and a `memory` command (`command X`). The tests walk every
//! reminder and sub-agent prompt with the role that receives it.

use super::policy;
use crate::agent::tools;

/// Programs a backticked command line may start with. `git` and
/// `mini-letta` never run in a child (the memory's git directory is
/// read-only to it and owned by root; the CLI needs the control socket);
/// the others need a shell (`Bash`).
const PROGRAMS: &[&str] = &[
    "git",
    "mini-letta",
    "wc",
    "cat",
    "ls",
    "grep",
    "sed",
    "awk",
    "head",
    "tail",
    "find",
    "rm",
    "mv",
    "cp",
    "echo",
    "printf",
    "du",
    "stat",
    "sort",
];

/// Programs no child can run, whatever its tools.
const NEVER_IN_A_CHILD: &[&str] = &["git", "mini-letta"];

/// Who receives a text: a peer role of the policy table (`agent`,
/// `reflection`, `memory-worker`, `recall`), or `None` for a request that
/// carries no tools (a compaction summary).
pub struct Receiver<'a> {
    pub role: Option<&'a str>,
    pub tools: &'a [&'a str],
}

/// What `text` names that `to` cannot do, one line each (empty: nothing).
pub fn unavailable(text: &str, to: &Receiver<'_>) -> Vec<String> {
    let mut out = Vec::new();
    for tool in named_tools(text) {
        if !to.tools.contains(&tool.as_str()) {
            out.push(format!("names the tool {tool:?}, which it does not have"));
        }
    }
    for program in named_programs(text) {
        if NEVER_IN_A_CHILD.contains(&program.as_str()) {
            out.push(format!(
                "tells it to run `{program}`, which no child can run"
            ));
        } else if !to.tools.contains(&"Bash") {
            out.push(format!(
                "tells it to run `{program}`, which needs Bash, a tool it does not have"
            ));
        }
    }
    for (command, quoted) in named_commands(text) {
        if !tools::MEMORY_COMMANDS.contains(&command.as_str()) {
            if quoted {
                out.push(format!(
                    "names the memory command {command:?}, which does not exist"
                ));
            }
            continue;
        }
        let method = tools::memory_command_method(&command);
        let allowed = to.role.is_some_and(|r| policy::allowed(r, method));
        if !to.tools.contains(&"memory") || !allowed {
            out.push(format!(
                "names the memory command {command:?} ({method}), which it may not run"
            ));
        }
    }
    out
}

/// Backticked spans of `text`.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Whether `c` continues a word.
fn wordish(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Byte offsets where `word` occurs as a whole word.
fn occurrences<'a>(text: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    text.match_indices(word).filter_map(move |(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        (!before.is_some_and(wordish) && !after.is_some_and(wordish)).then_some(i)
    })
}

/// Whether offset `i` starts a sentence (or a list item, or the text).
fn starts_sentence(text: &str, i: usize) -> bool {
    let before = text[..i].trim_end_matches(' ');
    before.is_empty() || before.ends_with(['.', '\n', '!', '?', '*', ':', '>'])
}

/// The tools `text` names: a backticked tool name, a tool name followed by
/// "tool", an unmistakable one (`recall_search`) anywhere, and a
/// capitalised one (`Read`, `Bash`) not at a sentence's start.
fn named_tools(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in tools::names() {
        let hit = backticked(text).iter().any(|s| s.trim() == name)
            || occurrences(text, name).any(|i| {
                let rest = &text[i + name.len()..];
                let capital = name.starts_with(|c: char| c.is_uppercase());
                rest.starts_with(" tool")
                    || name.contains('_')
                    || (capital && !starts_sentence(text, i))
            });
        if hit {
            out.push(name.to_string());
        }
    }
    out
}

/// The programs of backticked command lines (`VAR=x prog args`).
fn named_programs(text: &str) -> Vec<String> {
    backticked(text)
        .iter()
        .filter_map(|span| {
            span.split_whitespace()
                .find(|w| !w.contains('='))
                .filter(|w| PROGRAMS.contains(w))
                .map(str::to_string)
        })
        .collect()
}

/// `memory` commands `text` names: the word after "command" (backticked,
/// quoted or bare), with whether it was quoted (a quoted unknown name is a
/// mistake; a bare one is prose).
fn named_commands(text: &str) -> Vec<(String, bool)> {
    occurrences(text, "command")
        .filter_map(|i| {
            let rest = text[i + "command".len()..].trim_start_matches([' ', ':']);
            let quoted = rest.starts_with(['`', '"']);
            let word: String = rest
                .trim_start_matches(['`', '"'])
                .chars()
                .take_while(|c| wordish(*c))
                .collect();
            (!word.is_empty()).then_some((word, quoted))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::agent::reminders;
    use crate::paths::AgentPaths;
    use crate::reflection::prepare::SUBAGENT_TOOLS;
    use crate::reflection::prompt;
    use crate::store::record::{AgentRecord, DEFAULT_SYSTEM_PROMPT};
    use crate::supervisor::recall_delegate::RECALL_TOOLS;

    fn agent_tools() -> Vec<&'static str> {
        tools::names().collect()
    }

    /// The checker sees each kind of instruction a role cannot follow, and
    /// passes the ones it can.
    #[test]
    fn the_checker_finds_what_a_role_cannot_do() {
        let all = agent_tools();
        let agent = Receiver {
            role: Some("agent"),
            tools: &all,
        };
        let reflector = Receiver {
            role: Some("reflection"),
            tools: SUBAGENT_TOOLS,
        };
        let worker = Receiver {
            role: Some("memory-worker"),
            tools: SUBAGENT_TOOLS,
        };
        let recall = Receiver {
            role: Some("recall"),
            tools: RECALL_TOOLS,
        };
        let bad = [
            ("Check a file's size first (`wc -c`).", &reflector),
            ("Run `git pull --rebase origin main`.", &agent),
            ("Then `GIT_EDITOR=true git rebase --continue`.", &agent),
            ("Or `mini-letta sync -a owl --repair`.", &agent),
            (
                "Call your `memory` tool with command `repair_conflict`.",
                &worker,
            ),
            (
                "Start one with the memory tool (command `delegate`).",
                &reflector,
            ),
            ("Edit it with the memory tool.", &recall),
            ("Search with recall_search first.", &reflector),
            ("You have the memory tool and Bash.", &worker),
            ("Use the memory tool's command `push`.", &agent),
        ];
        for (text, to) in bad {
            assert!(!unavailable(text, to).is_empty(), "not caught: {text}");
        }
        let good = [
            ("Commit with your `memory` tool: command `commit`.", &agent),
            (
                "Read every listed file. Read a file before you edit it.",
                &reflector,
            ),
            ("Your tools: `memory` and Read.", &worker),
            (
                "Merge it with the memory tool (command merge, branch b).",
                &agent,
            ),
            ("Run `wc -c notes.md` to see its size.", &agent),
            ("Search with recall_search; read the hits.", &recall),
            ("the command is refused", &reflector),
            ("Write dates as absolute dates.", &recall),
        ];
        for (text, to) in good {
            assert_eq!(unavailable(text, to), Vec::<String>::new(), "{text}");
        }
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    /// Every reminder and every prompt a sub-agent starts with, with the
    /// role that receives it.
    fn every_instruction(tmp: &Path) -> Vec<(&'static str, Option<&'static str>, String)> {
        let agent = AgentPaths::from_dir(&tmp.join("agents/a1"));
        let mem = agent.memory_dir();
        let record: AgentRecord = serde_json::from_value(serde_json::json!({
            "id": "agent-1", "name": "owl", "system": DEFAULT_SYSTEM_PROMPT,
            "model": "mock", "created_at": "2026-01-01T00:00:00Z"
        }))
        .expect("record");
        let item: crate::reflection::queue::QueuedWorker = serde_json::from_value(
            serde_json::json!({"id": "w1", "instruction": "记住: x", "queuedAt": "t"}),
        )
        .expect("item");
        let broken = [crate::memfs::links::BrokenLink {
            index: "MEMORY.md".into(),
            target: "notes/old.md".into(),
        }];
        let wt = tmp.join("wt");
        write(&wt, "MEMORY.md", "# Memory\n");
        write(
            &wt,
            "human.md",
            "---\nname: Human\ndescription: u\n---\n- x\n",
        );
        let reflection = reflection_prompt(tmp, &wt);
        let worker = prompt::worker(&wt, "记住: 我喜欢绿茶", &[]).expect("worker");
        let recall = prompt::recall("what tea?");
        let agent_role = Some("agent");
        vec![
            (
                "system prompt",
                agent_role,
                DEFAULT_SYSTEM_PROMPT.to_string(),
            ),
            (
                "agent info",
                agent_role,
                crate::agent::runtime::agent_info(&record, &agent, "default"),
            ),
            (
                "MEMORY COMMIT NEEDED",
                agent_role,
                reminders::commit_needed(&mem, "2 changes", "The next sync pushes them."),
            ),
            (
                "MEMORY GIT CONFLICT",
                agent_role,
                reminders::git_conflict(&mem, "conflict in human.md", Some("refs/x")),
            ),
            (
                "MEMORY SYNC FAILED",
                agent_role,
                reminders::sync_failed(&mem, "push refused"),
            ),
            (
                "MEMORY LINKS BROKEN",
                agent_role,
                crate::agent::runtime::broken_links_text(&agent, &broken),
            ),
            (
                "MEMORY REVISION INVALID",
                agent_role,
                crate::store::prompt_cache::invalid_revision_notice("abc1234", "bad", None),
            ),
            (
                "MEMORY WORKER FAILED",
                agent_role,
                crate::reflection::queue::failed_reminder_text(&item),
            ),
            (
                "integration turn",
                agent_role,
                prompt::integration("mini-letta/reflection/b", "diff", "merge if right"),
            ),
            ("reflection system", Some("reflection"), reflection.system),
            ("reflection task", Some("reflection"), reflection.user),
            ("worker system", Some("memory-worker"), worker.system),
            ("worker task", Some("memory-worker"), worker.user),
            (
                "repair task",
                Some("memory-worker"),
                prompt::repair("mini-letta/memory-worker/b", "patch", &["- a".into()]),
            ),
            ("recall system", Some("recall"), recall.system),
            ("recall task", Some("recall"), recall.user),
            (
                "summary (all)",
                None,
                crate::agent::context::transcript::ALL_PROMPT.to_string(),
            ),
            (
                "summary (sliding)",
                None,
                crate::agent::context::transcript::SLIDING_PROMPT.to_string(),
            ),
        ]
    }

    /// A reflection's prompt for a small conversation, with an instruction.
    fn reflection_prompt(tmp: &Path, wt: &Path) -> prompt::ReflectionPrompt {
        use crate::protocol::messages::Role;
        use crate::reflection::payload::{SelectOptions, select_and_write};
        use crate::store::conversation::{Conversation, StoredMessage};
        let say = |conv: &mut Conversation, role: Role, text: &str| {
            let m = StoredMessage::new(
                conv.next_id(),
                role,
                vec![crate::protocol::messages::Part::text(text)],
            );
            conv.append(m).expect("append");
        };
        // A real agent: the reflector's system prompt holds its memory.
        let home = crate::paths::Home::at(tmp);
        let record = crate::store::create(&home, "r1", None).expect("create");
        let agent = home.agent(&record.id).expect("paths");
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "- I prefer tea");
        say(&mut conv, Role::Assistant, "Noted.");
        let opts = SelectOptions {
            user_instruction: Some("only tea".into()),
            ..Default::default()
        };
        let m = select_and_write(&agent, &record.id, &opts, time::OffsetDateTime::now_utc())
            .expect("select")
            .expect("a payload");
        let repo = crate::memfs::repo::open_agent(&agent).expect("repo");
        let base = repo.head().expect("head").target().expect("commit");
        prompt::build(&agent, &m, wt, base).expect("prompt")
    }

    /// Issue 31 §2: each reminder and sub-agent prompt names only tools and
    /// commands the role receiving it has (before: the reflector was told
    /// to run `wc -c`, the agent a git recipe and `mini-letta sync`).
    #[test]
    fn every_reminder_and_prompt_names_only_what_its_role_can_do() {
        let tmp = tempfile::tempdir().expect("tmp");
        let all = agent_tools();
        let mut problems = Vec::new();
        for (what, role, text) in every_instruction(tmp.path()) {
            let tools: &[&str] = match role {
                Some("agent") => &all,
                Some("reflection" | "memory-worker") => SUBAGENT_TOOLS,
                Some("recall") => RECALL_TOOLS,
                _ => &[],
            };
            for p in unavailable(&text, &Receiver { role, tools }) {
                problems.push(format!("{what} ({}): {p}", role.unwrap_or("no tools")));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
