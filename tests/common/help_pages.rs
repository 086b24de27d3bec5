//! The help pages as the built binary shows them (`--help` on every
//! command path), read apart: sections, option entries, subcommands and
//! the `Examples:` lines (shared by tests/cli_help.rs and
//! tests/help_examples.rs).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_mini-letta")
}

/// `mini-letta PATH… --help`, which must succeed.
pub fn help(path: &[String]) -> String {
    let o = Command::new(bin())
        .args(path)
        .arg("--help")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mini-letta {} --help: {}",
        path.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The lines of section `title` (e.g. `Options:`), up to the next
/// unindented line.
pub fn section<'a>(text: &'a str, title: &str) -> Vec<&'a str> {
    let mut lines = text.lines().skip_while(|l| *l != title);
    if lines.next().is_none() {
        return Vec::new();
    }
    lines
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .collect()
}

/// The names in a `Commands:` section (other than `help`).
pub fn subcommands(text: &str) -> Vec<String> {
    section(text, "Commands:")
        .into_iter()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Each entry of an `Arguments:` or `Options:` section with its help text
/// (empty when it has none). Entries look like `  -a, --agent <AGENT>  Help`
/// (help on the same line, after two spaces or more) or, in the long
/// format, the spec alone with the help on the following, deeper lines.
pub fn entries(lines: &[&str]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let is_entry = (2..=6).contains(&indent)
            && (trimmed.starts_with('-') || trimmed.starts_with('<') || trimmed.starts_with('['));
        if !is_entry {
            continue;
        }
        let (spec, same_line) = match trimmed.split_once("  ") {
            Some((spec, rest)) => (spec.to_string(), rest.trim().to_string()),
            None => (trimmed.trim_end().to_string(), String::new()),
        };
        let help = if !same_line.is_empty() {
            same_line
        } else {
            match lines.get(i + 1) {
                Some(next) if next.starts_with("          ") => next.trim().to_string(),
                _ => String::new(),
            }
        };
        out.push((spec, help));
    }
    out
}

/// Split an example line as a shell would (quotes, no expansion), up to a
/// pipe, a redirection or a comment.
pub fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '|' | '>' | '<' | '#') if !in_word => return words,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    assert!(quote.is_none(), "unbalanced quote in example: {line}");
    if in_word {
        words.push(word);
    }
    words
}

/// Every command path of the binary, found by following `Commands:`.
pub fn all_paths() -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let text = help(&path);
        for sub in subcommands(&text) {
            let mut p = path.clone();
            p.push(sub);
            todo.push(p);
        }
        out.push((path, text));
    }
    out.sort();
    out
}

/// One `Examples:` line: the page it is on, the command as a shell reads
/// it, and the comment after it (`# …`), which says how it ends when it
/// does not simply succeed.
#[derive(Debug, Clone)]
pub struct Example {
    pub page: Vec<String>,
    pub command: String,
    pub comment: Option<String>,
}

/// Split `line` at its comment: a `#` outside quotes that starts a word.
pub fn split_comment(line: &str) -> (String, Option<String>) {
    let mut quote: Option<char> = None;
    let mut prev_space = true;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '#') if prev_space => {
                return (
                    line[..i].trim_end().to_string(),
                    Some(line[i + 1..].trim().to_string()),
                );
            }
            _ => {}
        }
        prev_space = c.is_whitespace();
    }
    (line.trim_end().to_string(), None)
}

/// Every example of every help page, in page order.
pub fn examples() -> Vec<Example> {
    let mut out = Vec::new();
    for (page, text) in all_paths() {
        for line in section(&text, "Examples:") {
            let Some(cmd) = line.strip_prefix("  ") else {
                continue;
            };
            if !cmd.trim_start().starts_with("mini-letta") {
                continue;
            }
            let (command, comment) = split_comment(cmd.trim());
            out.push(Example {
                page: page.clone(),
                command,
                comment,
            });
        }
    }
    out
}
