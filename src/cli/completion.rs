//! Shell completion: `mini-letta completions SHELL` prints clap's script
//! for the commands and options, with a hook that asks
//! `mini-letta complete agents|conversations` for the values only a home
//! knows: agent names after `-a`/`--agent` (and where a command takes the
//! agent as its argument) and conversation ids after `--conversation`.

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::globals::Globals;
use crate::store::{self, conversation};

/// What `complete` lists.
#[derive(Debug, Subcommand)]
pub enum CompleteCommand {
    /// The home's agent names, one per line.
    #[command(after_help = "Examples:
  mini-letta complete agents
  mini-letta complete agents al")]
    Agents {
        /// Only names that start with it.
        #[arg(default_value = "")]
        prefix: String,
    },
    /// One agent's conversation ids, one per line.
    #[command(after_help = "Examples:
  mini-letta complete conversations -a owl
  mini-letta complete conversations -a owl wo")]
    Conversations(ConversationsArgs),
}

#[derive(Debug, Args)]
pub struct ConversationsArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Only ids that start with it.
    #[arg(default_value = "")]
    prefix: String,
}

/// `mini-letta complete …`: what a shell offers at a TAB. Quiet by design:
/// whatever goes wrong (no home, no such agent) it lists nothing and
/// exits 0, for an error printed under a half-typed command line only
/// garbles it.
pub fn run(cli: &Globals, cmd: &CompleteCommand) -> anyhow::Result<ExitCode> {
    let words = match cmd {
        CompleteCommand::Agents { prefix } => agent_names(cli)
            .into_iter()
            .filter(|n| n.starts_with(prefix.as_str()))
            .collect(),
        CompleteCommand::Conversations(args) => conversation_ids(cli, args.agent.as_deref())
            .into_iter()
            .filter(|n| n.starts_with(args.prefix.as_str()))
            .collect::<Vec<_>>(),
    };
    let mut out = std::io::stdout().lock();
    for w in words.iter().filter(|w| offerable(w)) {
        writeln!(out, "{w}")?;
    }
    Ok(ExitCode::SUCCESS)
}

fn agent_names(cli: &Globals) -> Vec<String> {
    let Ok(home) = cli.home() else {
        return Vec::new();
    };
    store::list(&home)
        .map(|agents| agents.into_iter().map(|a| a.name).collect())
        .unwrap_or_default()
}

fn conversation_ids(cli: &Globals, agent: Option<&str>) -> Vec<String> {
    let Ok(home) = cli.home() else {
        return Vec::new();
    };
    let Ok((_, paths)) = store::find(&home, agent) else {
        return Vec::new();
    };
    conversation::list_ids(&paths).unwrap_or_default()
}

/// A word a shell may be handed: names and ids are validated when made,
/// but a completion that reaches a terminal is checked again — nothing
/// that could be an escape sequence, a space or a shell metacharacter.
fn offerable(word: &str) -> bool {
    !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | '+'))
}

/// The commands whose first argument is an agent (`agent show owl`).
const AGENT_ARGUMENT: &[&str] = &[
    "show",
    "rename",
    "delete",
    "export",
    "release",
    "set-model",
    "set-budget",
    "set-network",
    "network-log",
];

/// `mini-letta completions SHELL`: clap's script for the program `cmd`
/// (named `bin_name`) with the hook.
pub fn script(shell: clap_complete::Shell, cmd: &mut clap::Command, bin_name: &str) -> Vec<u8> {
    let mut text = Vec::new();
    clap_complete::generate(shell, cmd, bin_name, &mut text);
    let text = String::from_utf8_lossy(&text).into_owned();
    let with_hook = match shell {
        // clap_complete names the states of a hyphenated program two ways
        // (`mini__letta__subcmd__chat` set, `mini__subcmd__letta__subcmd__chat`
        // matched), so no subcommand's options ever completed: one name.
        clap_complete::Shell::Bash => format!(
            "{}\n{}",
            text.replace("mini__subcmd__letta", "mini__letta"),
            bash_hook()
        ),
        clap_complete::Shell::Zsh => zsh_with_hook(&text),
        clap_complete::Shell::Fish => format!("{text}\n{}", fish_hook()),
        // Elvish and PowerShell: commands and options only.
        _ => text,
    };
    with_hook.into_bytes()
}

fn bash_hook() -> String {
    let agent_cmds = AGENT_ARGUMENT.join("|");
    format!(
        r#"# Values only this home knows: agent names and conversation ids.
_mini_letta_values() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local i agent="" words=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            -a|--agent) agent="${{COMP_WORDS[i+1]}}" ;;
        esac
    done
    case "$prev" in
        -a|--agent) words="$("$1" complete agents 2>/dev/null)" ;;
        --conversation) words="$("$1" complete conversations ${{agent:+-a "$agent"}} 2>/dev/null)" ;;
        *)
            if [[ $COMP_CWORD -eq 3 && "${{COMP_WORDS[1]}}" == agent && "$cur" != -* ]]; then
                case "${{COMP_WORDS[2]}}" in
                    {agent_cmds}) words="$("$1" complete agents 2>/dev/null)" ;;
                esac
            fi
            ;;
    esac
    if [[ -n "$words" ]]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
        return 0
    fi
    _mini__letta "$@"
}}
complete -F _mini_letta_values -o bashdefault -o default mini-letta
"#
    )
}

fn zsh_with_hook(text: &str) -> String {
    let functions = r#"# Values only this home knows: agent names and conversation ids.
_mini_letta_agents() {
    local -a names
    names=(${(f)"$(mini-letta complete agents 2>/dev/null)"})
    compadd -a names
}
_mini_letta_conversations() {
    local i agent
    for ((i = 2; i < CURRENT; i++)); do
        case $words[i] in
            -a|--agent) agent=$words[i+1] ;;
            --agent=*) agent=${words[i]#--agent=} ;;
        esac
    done
    local -a ids sel
    [[ -n $agent ]] && sel=(-a $agent)
    ids=(${(f)"$(mini-letta complete conversations $sel 2>/dev/null)"})
    compadd -a ids
}

"#;
    let mut out = String::with_capacity(text.len() + functions.len());
    for line in text.lines() {
        if line.starts_with("if [ \"$funcstack[1]\" = \"_mini-letta\" ]") {
            out.push_str(functions);
        }
        let line = if line.contains(":AGENT:_default'") {
            line.replace(":AGENT:_default'", ":AGENT:_mini_letta_agents'")
        } else if line.starts_with("'--conversation=[") {
            line.replace(":ID:_default'", ":ID:_mini_letta_conversations'")
        } else {
            line.to_string()
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn fish_hook() -> String {
    format!(
        r#"# Values only this home knows: agent names and conversation ids.
function __mini_letta_conversations
    set -l words (commandline -opc)
    set -l agent
    for i in (seq (count $words))
        if contains -- $words[$i] -a --agent
            set agent $words[(math $i + 1)]
        end
    end
    if test -n "$agent"
        mini-letta complete conversations -a $agent 2>/dev/null
    else
        mini-letta complete conversations 2>/dev/null
    end
end
complete -c mini-letta -s a -l agent -x -a '(mini-letta complete agents 2>/dev/null)'
complete -c mini-letta -l conversation -x -a '(__mini_letta_conversations)'
complete -c mini-letta -n "__fish_mini_letta_using_subcommand agent; and __fish_seen_subcommand_from {}" -x -a '(mini-letta complete agents 2>/dev/null)'
"#,
        AGENT_ARGUMENT.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::offerable;

    #[test]
    fn only_plain_words_are_offered() {
        for ok in ["owl", "conv-1a2b", "agent-0f3e_x", "a.b@c+d"] {
            assert!(offerable(ok), "{ok}");
        }
        for bad in [
            "",
            "x\u{1b}]52;c;aGk=\u{7}",
            "a b",
            "a;b",
            "$(id)",
            "`id`",
            "a\nb",
            "\u{202e}txt",
        ] {
            assert!(!offerable(bad), "{bad:?}");
        }
    }
}
