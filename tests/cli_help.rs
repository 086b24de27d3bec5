//! Help that teaches: every `mini-letta` command, as the built binary
//! shows it (`--help` on every command path), says what each option and
//! argument is for, and every leaf command shows at least one example
//! (`Examples:` then indented command lines) that the parser accepts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;

#[path = "common/help_pages.rs"]
mod help_pages;
use std::process::Command;

use help_pages::{all_paths, bin, entries, help, section, shell_words, subcommands};

#[test]
fn every_option_and_argument_has_help_and_every_leaf_an_example() {
    let paths = all_paths();
    assert!(paths.len() > 30, "only {} commands found", paths.len());
    let mut problems = Vec::new();
    for (path, text) in &paths {
        let name = format!("mini-letta {}", path.join(" "));
        let mut args = section(text, "Arguments:");
        args.extend(section(text, "Options:"));
        let found = entries(&args);
        assert!(
            found.iter().any(|(spec, _)| spec.contains("--help")),
            "{name}: no options parsed from\n{text}"
        );
        for (spec, help) in found {
            if help.is_empty() {
                problems.push(format!("{name}: {spec} has no help text"));
            }
        }
        if !subcommands(text).is_empty() {
            continue;
        }
        let examples: Vec<&str> = section(text, "Examples:")
            .into_iter()
            .filter(|l| !l.trim().is_empty())
            .collect();
        if examples.is_empty() {
            problems.push(format!("{name}: no Examples: section"));
            continue;
        }
        let mut own = 0;
        for line in examples {
            let Some(cmd) = line.strip_prefix("  ") else {
                problems.push(format!("{name}: example not indented: {line:?}"));
                continue;
            };
            let words = shell_words(cmd);
            if words.first().map(String::as_str) != Some("mini-letta") {
                problems.push(format!("{name}: example does not run mini-letta: {line:?}"));
                continue;
            }
            if words.get(1..=path.len()) == Some(path.as_slice()) {
                own += 1;
            }
            if let Err(e) = mini_letta::cli::Cli::try_parse_from(&words) {
                problems.push(format!("{name}: example {cmd:?} does not parse: {e}"));
            }
        }
        if own == 0 {
            problems.push(format!("{name}: no example runs {name}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checker itself: it sees a missing help text in both layouts.
#[test]
fn the_checker_finds_options_without_help() {
    let same_line = [
        "  -a, --agent <AGENT>  Agent id",
        "      --json",
        "  -h, --help  Print help",
    ];
    let found = entries(&same_line);
    assert_eq!(found.len(), 3);
    assert_eq!(found[0], ("-a, --agent <AGENT>".into(), "Agent id".into()));
    assert_eq!(found[1], ("--json".into(), String::new()));
    let next_line = [
        "      --memory-dir <DIR>",
        "          The memory repository",
        "",
        "      --json",
        "",
        "  -h, --help",
        "          Print help",
    ];
    let found = entries(&next_line);
    assert_eq!(found.len(), 3);
    assert_eq!(found[0].1, "The memory repository");
    assert_eq!(found[1], ("--json".into(), String::new()));
    assert_eq!(
        shell_words("mini-letta chat -p 'a b' --x \"c d\" | less"),
        ["mini-letta", "chat", "-p", "a b", "--x", "c d"]
    );
}

#[test]
fn the_users_commands_are_all_listed_and_internal_ones_are_not() {
    let top = help(&[]);
    let names = subcommands(&top);
    for expected in [
        "agent",
        "memory",
        "prompt",
        "chat",
        "attach",
        "conversations",
        "recompile",
        "supervisor",
        "ps",
        "sandbox",
        "completions",
        "man",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    assert!(!names.iter().any(|n| n == "channel"), "{names:?}");
    let o = Command::new(bin())
        .args(["channel", "ping"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "channel is no user command");
    // The agent-side program holds it.
    let o = Command::new(env!("CARGO_BIN_EXE_mini-letta-agent"))
        .args(["channel", "--help"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("call") && text.contains("ping"), "{text}");
}

/// `-a/--agent AGENT` is the same everywhere an agent is worked on, and
/// defaults to the only agent wherever one is needed.
#[test]
fn every_command_on_one_agent_takes_dash_a() {
    let paths = all_paths();
    let mut with_agent = Vec::new();
    for (path, text) in &paths {
        let mut args = section(text, "Options:");
        args.extend(section(text, "Arguments:"));
        if let Some((_, help)) = entries(&args)
            .into_iter()
            .find(|(spec, _)| spec == "-a, --agent <AGENT>")
        {
            with_agent.push(path.join(" "));
            // clap names required options in the usage line.
            let usage = text.lines().find(|l| l.starts_with("Usage:")).unwrap();
            assert!(
                !usage.contains("--agent <AGENT>"),
                "{path:?}: --agent is required"
            );
            if path.join(" ") != "memory compile" && path.join(" ") != "agent show" {
                assert!(help.contains("default: the only agent"), "{path:?}: {help}");
            }
        }
    }
    for expected in [
        "agent show",
        "attach",
        "chat",
        "conversations",
        "memory commit",
        "memory compile",
        "memory diff",
        "memory insert",
        "memory log",
        "memory show",
        "memory tree",
        "memory validate",
        "prompt",
        "recompile",
        "sandbox run",
    ] {
        assert!(
            with_agent.iter().any(|p| p == expected),
            "{expected}: {with_agent:?}"
        );
    }
}

/// `--version` alone is answered before the parser is built; what it
/// prints must be what the parser prints for it (checked through a form
/// the shortcut does not take: the global `-v` first).
#[test]
fn the_quick_version_answer_is_the_parsers() {
    let out = |args: &[&str]| {
        let o = Command::new(bin()).args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    let parser = out(&["-v", "--version"]);
    assert_eq!(
        parser,
        format!("mini-letta {}\n", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(out(&["--version"]), parser);
    assert_eq!(out(&["-V"]), parser);
}
