//! The command line: clap definitions (one file per command group) and
//! dispatch into the library. Errors become one line on stderr.

mod agent;
mod agent_make;
mod audit;
mod chat;
mod cluster;
mod completion;
mod config;
mod context;
mod conversations;
mod doctor;
mod globals;
mod interrupt;
mod memory;
mod network;
mod palace;
mod prompt;
mod recall;
mod reflect;
mod sandbox;
mod spinner;
mod supervisor;
mod sync;
mod terminal;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, FromArgMatches, Parser, Subcommand};

use crate::console::{init_logging, one_line, output, style};
use crate::paths::Home;
use globals::Globals;

/// Stateful AI agents whose memory is a git repository of Markdown files.
#[derive(Debug, Parser)]
#[command(
    name = "mini-letta",
    version,
    about,
    long_about = None,
    after_help = "Examples:
  mini-letta agent create owl
  mini-letta chat -p 'hello'
  mini-letta memory tree
  mini-letta help memory insert",
    after_long_help = "Examples:
  mini-letta agent create owl
  mini-letta chat -p 'hello'
  mini-letta memory tree
  mini-letta help memory insert

Exit status:
  0    success
  1    an error, a refusal, or a turn that did not finish (an error, or
       --max-steps reached: the hint says so)
  2    a command line clap cannot parse; `memory validate` when the
       repository cannot be judged
  3    `supervisor status`: no supervisor runs
  130  a turn cancelled with Ctrl-C
  128+N  ended by signal N (143: SIGTERM)

Configuration: <home>/config.toml ([model], [providers.*], [reflection],
[network], [quota], [audit], [cluster]); `mini-letta config show` prints
each setting in effect and where it came from. Environment:
MINI_LETTA_HOME, MINI_LETTA_CONTEXT_WINDOW, MINI_LETTA_REFLECTION_CONTEXT_WINDOW,
MINI_LETTA_REMOTE_ROOT, MINI_LETTA_ETCD, MINI_LETTA_HOST_ID,
MINI_LETTA_LEASE_SECS, MINI_LETTA_SANDBOX_DISABLE, MINI_LETTA_NAMESPACES,
MINI_LETTA_WARM_CHILDREN, MINI_LETTA_WARM_IDLE_SECS, MINI_LETTA_DRAIN_SECS,
MINI_LETTA_AUDIT_ROTATE_BYTES, MINI_LETTA_AUDIT (=off, for measuring only),
MINI_LETTA_SCRIPTED_MODEL, MINI_LETTA_CONSTRAINTS_UPDATE (=1 approves a
change of .memfs.config.json), OPENAI_API_KEY, OPENAI_BASE_URL, ANTHROPIC_API_KEY,
ANTHROPIC_BASE_URL, RUST_LOG. (MINI_LETTA_CHANNEL_FD, MINI_LETTA_SANDBOX,
MINI_LETTA_ISOLATION and MINI_LETTA_STAGE_MARKS are set for children.)"
)]
pub struct Cli {
    #[command(flatten)]
    globals: Globals,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create, list, inspect, rename, export and import agents.
    #[command(subcommand)]
    Agent(agent::AgentCommand),
    /// Read and compile an agent's memory repository.
    #[command(subcommand)]
    Memory(memory::args::MemoryCommand),
    /// Print an agent's compiled system prompt.
    ///
    /// Exact bytes in a pipe; on a terminal, control characters are shown
    /// visibly (`^[`, `\u{7}`).
    Prompt(prompt::PromptArgs),
    /// Talk to an agent: one turn with -p, else an interactive session.
    Chat(chat::args::ChatArgs),
    /// Follow a conversation's messages as they are stored (from another terminal).
    Attach(chat::attach::AttachArgs),
    /// List an agent's conversations.
    Conversations(conversations::ConversationsArgs),
    /// Compile a conversation's system prompt from memory now and cache it.
    Recompile(conversations::RecompileArgs),
    /// Show a conversation's context window: tokens used, the compaction
    /// threshold, messages in context and stored, the last compaction.
    Context(context::ContextArgs),
    /// Compact a conversation now: summarise older messages into one
    /// summary message (the log keeps them).
    Compact(context::CompactArgs),
    /// Search everything an agent has said (ranked), or rebuild its index.
    #[command(subcommand)]
    Recall(recall::RecallCommand),
    /// Reflect now: fold what the agent's conversations added into its
    /// memory (a confined child in a worktree, merged when it exits); or
    /// show the reflection state.
    Reflect(reflect::ReflectArgs),
    /// Sync an agent's memory with its remote ($MINI_LETTA_REMOTE_ROOT):
    /// fetch, fast-forward or rebase, validate, push (never forced).
    Sync(sync::SyncArgs),
    /// Several hosts under one etcd (see docs/cluster.md): the hosts, and
    /// which one owns each agent.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Find what is wrong with agents (git state, validation, sizes, links,
    /// reflection, locks, worktrees, sync, sandbox, recall) and how to fix it.
    Doctor(doctor::DoctorArgs),
    /// A read-only web view of agents' memory, history and conversations:
    /// served on loopback, or exported as static pages.
    #[command(subcommand)]
    Palace(palace::PalaceCommand),
    /// Start, stop and inspect the home's supervisor.
    ///
    /// With none running, a command that needs one (chat, sync, reflect,
    /// sandbox run) runs one in its own process for its duration, and other
    /// commands may use it meanwhile. When the command is done, that
    /// supervisor drains: it takes nothing new (a chat sends its next turn
    /// to the next supervisor), lets the others' turns and queued memory
    /// workers finish for at most 5 minutes ($MINI_LETTA_DRAIN_SECS), then
    /// stops what is left (instructions not yet applied stay queued).
    /// `supervisor start` runs one in the background instead.
    #[command(subcommand)]
    Supervisor(supervisor::SupervisorCommand),
    /// List the supervisor's live children (agent id and name, role, pid,
    /// uptime, state); with --all, also those that ended lately.
    #[command(after_help = "Examples:\n  mini-letta ps\n  mini-letta ps --all --json")]
    Ps {
        /// Also show children that ended (the supervisor keeps the last 64
        /// ended within the last 10 minutes).
        #[arg(long)]
        all: bool,
        /// Print {"supervisor_running": …, "children": [...]} instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run commands confined as an agent's child would be.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCommand),
    /// Check and read the tamper-evident audit log (every spawn, tool
    /// call, commit, merge, sync, model call, refusal and policy change).
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// What each agent used (turns, model calls, tokens, tool calls, CPU,
    /// peak memory), summed from the audit log.
    Usage(audit::UsageArgs),
    /// Where config.toml is, every setting in effect and where it came
    /// from, and whether every reader accepts the file.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Print a shell completion script for mini-letta on stdout.
    #[command(after_help = "Examples:
  mini-letta completions bash > ~/.local/share/bash-completion/completions/mini-letta
  mini-letta completions zsh > ~/.zfunc/_mini-letta   # with fpath+=(~/.zfunc) in ~/.zshrc
  mini-letta completions fish > ~/.config/fish/completions/mini-letta.fish

Each file goes where the shell looks for completions (make the directory
first if it is missing); a new shell then completes commands, options,
agent names (-a) and conversation ids (--conversation).")]
    Completions {
        /// The shell to complete for.
        #[arg(value_enum, value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// List what a shell offers at a TAB: this home's agent names or an
    /// agent's conversation ids, one per line (the completion scripts ask
    /// it; nothing, never an error, when there is nothing to offer).
    #[command(subcommand)]
    Complete(completion::CompleteCommand),
    /// Print mini-letta's man page (roff) on stdout, or write one page per
    /// command into a directory.
    #[command(after_help = "Examples:
  mini-letta man | man -l -
  mini-letta man --out ~/.local/share/man/man1")]
    Man {
        /// Write mini-letta.1 and a page per subcommand
        /// (mini-letta-memory-show.1, …) into DIR and list them, instead of
        /// printing the main page.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

/// Parse the arguments, run the command, and turn errors into exit codes.
///
/// A reader that went away (`mini-letta memory log | head`) ends the
/// command quietly with success, as a filter's would: neither the panic of
/// a `println!` into the closed pipe nor a write error is reported.
pub fn main() -> ExitCode {
    crate::protocol::timings::note_start();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !panic_text(info.payload()).is_some_and(output::is_broken_pipe_message) {
            previous(info);
        }
    }));
    match std::panic::catch_unwind(run_main) {
        Ok(code) => code,
        Err(p) if panic_text(&*p).is_some_and(output::is_broken_pipe_message) => ExitCode::SUCCESS,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// A panic's message, when it is text.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
}

fn run_main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = parse_hot(&args).unwrap_or_else(|| Cli::parse_from(&args));
    // Still single-threaded: the only moment a user's process can enter
    // its namespace of per-agent uids.
    if !matches!(
        cli.command,
        Command::Completions { .. } | Command::Man { .. } | Command::Complete(_)
    ) && let Ok(home) = Home::resolve(cli.globals.home_flag())
    {
        crate::sandbox::identity::enter_subids(home.root());
    }
    init_logging(cli.globals.verbosity());
    let result = run(&cli);
    interrupt::hold_if_ending();
    match result {
        Ok(code) => code,
        Err(e) if output::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            style::eprint_error(&one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// One-shot commands that scripts run in loops (`memory compile`, `prompt`)
/// are parsed against a tree holding only them: building clap's whole
/// command tree costs about a millisecond, a fifth of such a run. Any
/// failure (help, version, a typo) returns `None` and the full parser runs,
/// so messages and behaviour are exactly the full tree's; the definitions
/// are the same derived ones, so a successful parse means the same.
fn parse_hot(args: &[std::ffi::OsString]) -> Option<Cli> {
    let mut words = args
        .iter()
        .skip(1)
        .scan(false, |after_home, a| {
            // Skip global flags and the value of `--home DIR`.
            let skip = *after_home || a.to_str().is_none_or(|s| s.starts_with('-'));
            *after_home = a == "--home";
            Some((skip, a))
        })
        .filter(|(skip, _)| !skip)
        .map(|(_, a)| a.to_str().unwrap_or(""));
    let tree = match (words.next()?, words.next()) {
        ("memory", Some("compile")) => clap::Command::new("memory").subcommand(
            memory::args::CompileArgs::augment_args(clap::Command::new("compile")),
        ),
        ("prompt", _) => prompt::PromptArgs::augment_args(clap::Command::new("prompt")),
        // A scripted one-shot turn: the command whose time issue 38 counts.
        ("chat", _) => chat::args::ChatArgs::augment_args(clap::Command::new("chat")),
        _ => return None,
    };
    let root = Globals::augment_args(clap::Command::new(Cli::command_name())).subcommand(tree);
    let matches = root.try_get_matches_from(args).ok()?;
    Cli::from_arg_matches(&matches).ok()
}

impl Cli {
    /// The program's name as the full parser knows it.
    fn command_name() -> &'static str {
        "mini-letta"
    }
}

fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    let globals = &cli.globals;
    match &cli.command {
        Command::Agent(cmd) => agent::run(globals, cmd),
        Command::Memory(cmd) => memory::run(globals, cmd),
        Command::Prompt(args) => prompt::run(globals, args),
        Command::Supervisor(cmd) => supervisor::run(globals, cmd),
        Command::Chat(args) => chat::chat(globals, args),
        Command::Attach(args) => chat::attach::attach(globals, args),
        Command::Conversations(args) => conversations::conversations(globals, args),
        Command::Recompile(args) => conversations::recompile(globals, args),
        Command::Context(args) => context::context(globals, args),
        Command::Compact(args) => context::compact(globals, args),
        Command::Recall(cmd) => recall::run(globals, cmd),
        Command::Reflect(args) => reflect::run(globals, args),
        Command::Sync(args) => sync::run(globals, args),
        Command::Cluster(cmd) => cluster::run(globals, cmd),
        Command::Doctor(args) => doctor::run(globals, args),
        Command::Palace(cmd) => palace::run(globals, cmd),
        Command::Ps { all, json } => supervisor::ps(globals, *all, *json),
        Command::Sandbox(cmd) => sandbox::run(globals, cmd),
        Command::Audit(cmd) => audit::run(globals, cmd),
        Command::Usage(args) => audit::usage(globals, args),
        Command::Config(cmd) => config::run(globals, cmd),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let script = completion::script(*shell, &mut Cli::command(), Cli::command_name());
            output::raw(&script)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Complete(cmd) => completion::run(globals, cmd),
        Command::Man { out } => man(out.as_deref()),
    }
}

/// `mini-letta man [--out DIR]`.
fn man(out: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    use clap::CommandFactory;
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let Some(dir) = out else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page)?;
        output::raw(&page)?;
        return Ok(ExitCode::SUCCESS);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fn write_pages(cmd: &clap::Command, dir: &std::path::Path) -> anyhow::Result<()> {
        let page = clap_mangen::Man::new(cmd.clone())
            .generate_to(dir)
            .with_context(|| format!("cannot write a man page into {}", dir.display()))?;
        println!("{}", page.display());
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            write_pages(sub, dir)?;
        }
        Ok(())
    }
    write_pages(&cmd, dir)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(std::ffi::OsString::from).collect()
    }

    /// The narrow parse gives what the full one gives, or declines.
    #[test]
    fn hot_parse_matches_the_full_parser() {
        let cases: &[&[&str]] = &[
            &["mini-letta", "memory", "compile", "--memory-dir", "/x"],
            &[
                "mini-letta",
                "-v",
                "--home",
                "/h",
                "memory",
                "compile",
                "-a",
                "bob",
                "--json",
            ],
            &[
                "mini-letta",
                "memory",
                "compile",
                "--memory-dir",
                "/x",
                "--home",
                "/h",
                "-vv",
            ],
            &["mini-letta", "--home=/h", "prompt", "-a", "x", "--fresh"],
            &["mini-letta", "prompt"],
            &[
                "mini-letta",
                "chat",
                "-a",
                "x",
                "-p",
                "hi",
                "--json",
                "--timings",
            ],
            &[
                "mini-letta",
                "--home",
                "/h",
                "chat",
                "-p",
                "-",
                "--isolation",
                "off",
            ],
            &[
                "mini-letta",
                "chat",
                "--conversation",
                "work",
                "--model",
                "mock",
            ],
        ];
        for case in cases {
            let hot = parse_hot(&os(case)).unwrap_or_else(|| panic!("declined {case:?}"));
            let full = Cli::try_parse_from(os(case)).unwrap();
            assert_eq!(format!("{hot:?}"), format!("{full:?}"), "{case:?}");
        }
        let declined: &[&[&str]] = &[
            &["mini-letta", "memory", "compile", "--help"],
            &["mini-letta", "memory", "compile"],
            &[
                "mini-letta",
                "memory",
                "compile",
                "--memory-dir",
                "/x",
                "-a",
                "y",
            ],
            &["mini-letta", "--version"],
            &["mini-letta", "memory", "show", "x"],
            &[
                "mini-letta",
                "--home",
                "memory",
                "compile",
                "--memory-dir",
                "/x",
            ],
            &["mini-letta", "agent", "list"],
            &["mini-letta", "chat", "--help"],
            &["mini-letta", "chat", "-p"],
            &["mini-letta", "chat", "--no-such-flag"],
        ];
        for case in declined {
            assert!(parse_hot(&os(case)).is_none(), "{case:?}");
        }
        assert_eq!(
            <Cli as clap::CommandFactory>::command().get_name(),
            Cli::command_name()
        );
    }
}

#[cfg(test)]
mod shape_tests {
    use clap::CommandFactory;

    /// Every command of the user's type is one a user may type: none is
    /// hidden, none has an internal-looking name.
    #[test]
    fn the_user_command_type_has_no_hidden_entry() {
        fn walk(cmd: &clap::Command, path: &str) {
            for sub in cmd.get_subcommands() {
                let name = format!("{path} {}", sub.get_name());
                assert!(!sub.is_hide_set(), "hidden command: {name}");
                assert!(!sub.get_name().starts_with('_'), "internal name: {name}");
                walk(sub, &name);
            }
        }
        walk(&super::Cli::command(), "mini-letta");
    }
}
