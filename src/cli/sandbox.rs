//! `mini-letta sandbox …`: run commands as a role's child would run.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::globals::Globals;
use super::terminal;
use crate::paths::Home;
use crate::protocol::client::Client;
use crate::protocol::events::ChildExit;
use crate::protocol::timings;
use crate::protocol::{Call, SpawnParams, StdioMode};
use crate::sandbox::probes::Verdict;
use crate::sandbox::report::{Isolation, SandboxReport};
use crate::supervisor::Session;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

/// How long a child's output may still arrive after its exit: a
/// descendant holding the pipe or pty would keep it open for ever.
const RELAY_DRAIN: crate::retry::Policy = crate::retry::Policy::polling(
    std::time::Duration::from_millis(5),
    std::time::Duration::from_secs(1),
);

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Run a command as a child of the given role, through the supervisor
    /// (an embedded one if none runs), passing stdio and the exit status
    /// through. A command that is not found exits 127, one that cannot be
    /// executed 126 (as shells do).
    #[command(after_help = "Examples:
  mini-letta sandbox run -- id
  mini-letta sandbox run -a owl --role agent -- sh -c 'ls -la \"$MEMORY_DIR\"'
  mini-letta sandbox run --workspace ~/project -- make test
  mini-letta sandbox run --json -- uname -r")]
    Run(RunArgs),
    /// Print the confinement layers this host offers, the isolation level
    /// they reach (L0 best … L4), and why any layer is missing.
    #[command(after_help = "Examples:
  mini-letta sandbox status
  mini-letta sandbox status --json")]
    Status {
        /// Print the host's report: {"level", "backend", "namespaces",
        /// "landlock", "seccomp", "cgroup", "uid_switch", "no_new_privs",
        /// "missing", …}, each layer as {"available", "detail"}.
        #[arg(long)]
        json: bool,
    },
    /// Run the escape catalogue: each attack in its own confined child of a
    /// throw-away attacker agent, next to a decoy agent, a decoy secret in
    /// the supervisor's environment and a sibling child. One line per
    /// attack (blocked, ESCAPED, skipped: reason) and a summary; exits 1 on
    /// any escape, or in strict mode when too few attacks could run.
    #[command(after_help = "Examples:
  mini-letta sandbox verify
  mini-letta sandbox verify --role tool --json
  mini-letta sandbox verify --isolation degraded")]
    Verify {
        /// Role whose confinement is attacked.
        #[arg(long, default_value = "agent", value_parser = ["tool", "agent", "memory-worker", "reflection", "recall"])]
        role: String,
        /// Confinement the attacked children get: strict (every layer the
        /// role needs, else refuse), degraded (what the host has) or off.
        #[arg(long, default_value = "strict", value_parser = ["strict", "degraded", "off"])]
        isolation: String,
        /// Print {"ok", "report": {"blocked", "escaped", "skipped",
        /// "failures", "results": [...]}} instead of one line per attack.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Role whose confinement applies.
    #[arg(long, default_value = "tool", value_parser = ["tool", "agent", "memory-worker", "reflection", "recall"])]
    role: String,
    /// Directory to run in (default: the agent's directory).
    #[arg(long, value_name = "DIR")]
    workspace: Option<std::path::PathBuf>,
    /// strict (default): refuse unless every layer the role needs is active;
    /// degraded: accept fewer layers, loudly; off: no confinement at all.
    #[arg(long, default_value = "strict", value_parser = ["strict", "degraded", "off"])]
    isolation: String,
    /// Pass the child's terminal output through untouched. By default, when
    /// run from a terminal, the child gets a pty of its own and only text
    /// and plain colour reach yours (no title, clipboard, cursor or mode
    /// sequences); your terminal's modes are restored when it ends.
    #[arg(long)]
    raw: bool,
    /// Capture the command's output instead of passing the terminal and
    /// print {"exit_code", "signal", "stdout", "stderr"} when it ends
    /// (exit_code null when a signal ended it; output as UTF-8, invalid
    /// bytes replaced). The exit status is the command's, as without --json.
    #[arg(long, conflicts_with = "raw")]
    json: bool,
    /// When the command ends, print where the time went: the marks of this
    /// CLI, the supervisor and the child's stage (each confinement layer)
    /// on one monotonic clock, as a table on stderr (with --json, as
    /// "timings": {"marks", "phases"} in the document).
    #[arg(long)]
    timings: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

pub fn run(cli: &Globals, cmd: &SandboxCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SandboxCommand::Run(args) => run_child(cli, args),
        SandboxCommand::Status { json } => status(*json),
        SandboxCommand::Verify {
            role,
            isolation,
            json,
        } => verify(role, isolation, *json),
    }
}

fn run_child(cli: &Globals, args: &RunArgs) -> anyhow::Result<ExitCode> {
    if args.timings {
        timings::enable_from_start("cli.main");
    }
    let home = cli.home()?;
    let (record, _) = crate::store::find(&home, args.agent.as_deref())?;
    let workspace = match &args.workspace {
        Some(w) => Some(
            std::fs::canonicalize(w)
                .with_context(|| format!("workspace {}", w.display()))?
                .display()
                .to_string(),
        ),
        None => None,
    };
    let spawn = |passed: &[RawFd; 3]| -> anyhow::Result<Spawned> {
        spawn_child(&home, &record.id, args, workspace.as_deref(), passed)
    };
    if args.json {
        return run_captured(&spawn);
    }
    let pty = pty_for_terminal()?;
    let passed: [RawFd; 3] = match &pty {
        Some(p) => [p.slave.as_raw_fd(); 3],
        None => [0, 1, 2],
    };
    let Spawned {
        mut session,
        child,
        mut exits,
    } = spawn(&passed)?;
    let client = &mut session.client;
    let relay = match pty {
        Some(p) => Some(relay_pty(p, args.raw)?),
        None => None,
    };
    let exit = client.wait_exit(child, &mut exits);
    if let Some((out, raw_mode)) = relay {
        // The output ends when the pty closes; a descendant still holding
        // it would keep it open, so wait only briefly after the exit.
        RELAY_DRAIN.wait_for(|| out.is_finished());
        drop(raw_mode);
    }
    let exit = exit?;
    let marks = child_timings(&mut session.client, child);
    session.close();
    if let Some(marks) = marks {
        eprint!("{}", timings::table(&marks));
    }
    Ok(exit_status(&exit))
}

/// Start `args.command` as a child of agent `agent` (an id) through a
/// session of the home's supervisor, on the descriptors `passed` (its
/// stdin, stdout and stderr).
fn spawn_child(
    home: &Home,
    agent: &str,
    args: &RunArgs,
    workspace: Option<&str>,
    passed: &[RawFd; 3],
) -> anyhow::Result<Spawned> {
    let mut session = Session::open(home)?;
    timings::mark("cli.connected");
    // A signal ends the command, but not before its embedded
    // supervisor (and with it the child) is stopped and its files gone.
    super::interrupt::install();
    super::interrupt::set_stopper(session.stopper());
    let client = &mut session.client;
    client.call_as::<crate::protocol::replies::Subscribed>(Call::Subscribe {})?;
    let id = client.send_request_with_fds(
        Call::Spawn(SpawnParams {
            agent: agent.to_string(),
            role: args.role.clone(),
            argv: args.command.clone(),
            stdio: StdioMode::Passed,
            workspace: workspace.map(str::to_string),
            isolation: Some(args.isolation.clone()),
            model: None,
        }),
        passed,
    )?;
    // child.exit may arrive before the spawn response: remember them all.
    let mut exits = Vec::new();
    let spawned: crate::protocol::replies::Started =
        client.wait_reply_keeping_exits(id, "child.spawn", &mut exits)?;
    timings::mark("cli.spawned");
    let child = spawned.child;
    Ok(Spawned {
        session,
        child,
        exits,
    })
}

/// The operator's terminal is never handed to the child: when any of our
/// stdio is one, the child gets a fresh pty (made like it) and we relay it.
fn pty_for_terminal() -> anyhow::Result<Option<terminal::Pty>> {
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let std_fds = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    let tty = std_fds
        .iter()
        .copied()
        .find(|fd| terminal::is_terminal(*fd));
    let pty = match tty {
        Some(like) => Some(terminal::open_pty(like).context("cannot open a pty for the child")?),
        None => None,
    };
    Ok(pty)
}

/// Relay the child's pty (its slave end now the child's alone): our stdin
/// to it on a detached thread, its output to our stdout (cleaned unless
/// `raw`) on the returned one; our terminal in raw mode meanwhile, when
/// stdin is one (restored when the returned mode drops).
fn relay_pty(
    p: terminal::Pty,
    raw: bool,
) -> anyhow::Result<(std::thread::JoinHandle<()>, Option<terminal::RawMode>)> {
    drop(p.slave);
    let stdin_tty = terminal::is_terminal(std::io::stdin().as_fd());
    // Raw mode on our side: keys go to the child's pty as typed,
    // and the pty (not our terminal) echoes and edits.
    let raw_mode = if stdin_tty {
        Some(terminal::RawMode::enter(std::io::stdin().as_fd())?)
    } else {
        None
    };
    let master = std::sync::Arc::new(p.master);
    let m = master.clone();
    // Detached: a read of our stdin cannot be interrupted.
    std::thread::spawn(move || terminal::relay_input(&m, stdin_tty));
    let m = master.clone();
    let out = std::thread::spawn(move || {
        terminal::relay_output(&m, raw, &mut std::io::stdout());
    });
    Ok((out, raw_mode))
}

/// With `--timings`: the child's launch marks from the supervisor (its own
/// and its stage's) added to this process's; `None` when not asked.
fn child_timings(client: &mut Client, child: u64) -> Option<Vec<timings::Mark>> {
    if !timings::enabled() {
        return None;
    }
    timings::mark("cli.exited");
    match client.call_as::<crate::protocol::replies::ChildMarks>(Call::ChildTimings { child }) {
        Ok(m) => timings::extend(m.marks),
        Err(e) => tracing::warn!("no launch timings from the supervisor: {e}"),
    }
    Some(timings::taken())
}

/// A child started by `sandbox run`: the session it was spawned on, its id,
/// and the exits seen while waiting for the spawn's answer.
struct Spawned {
    session: Session,
    child: u64,
    exits: Vec<ChildExit>,
}

/// The shell's exit status for how a child ended: its code, or 128 + the
/// signal that killed it.
fn exit_status(exit: &ChildExit) -> ExitCode {
    match (exit.code(), exit.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from((128 + sig) & 0xff).unwrap_or(1)),
        _ => ExitCode::FAILURE,
    }
}

/// `sandbox run --json`: the child writes into pipes we read whole; its
/// stdin is ours unless ours is a terminal (then it gets none).
fn run_captured(
    spawn: &dyn Fn(&[RawFd; 3]) -> anyhow::Result<Spawned>,
) -> anyhow::Result<ExitCode> {
    let (out_r, out_w) = std::io::pipe()?;
    let (err_r, err_w) = std::io::pipe()?;
    let stdin = std::io::stdin();
    let null;
    let stdin_fd = if terminal::is_terminal(stdin.as_fd()) {
        null = std::fs::File::open("/dev/null")?;
        null.as_raw_fd()
    } else {
        stdin.as_raw_fd()
    };
    // Read into shared buffers: a descendant that outlives the child may
    // hold a pipe open, and then we take what came before it.
    let read_all = |mut r: std::io::PipeReader| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let reader = std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n @ 1..) = std::io::Read::read(&mut r, &mut chunk) {
                if let Ok(mut b) = sink.lock() {
                    b.extend_from_slice(chunk.get(..n).unwrap_or_default());
                }
            }
        });
        (reader, buf)
    };
    let out = read_all(out_r);
    let err = read_all(err_r);
    let spawned = spawn(&[stdin_fd, out_w.as_raw_fd(), err_w.as_raw_fd()]);
    // Only the child holds the write ends now: the reads end with it.
    drop(out_w);
    drop(err_w);
    let Spawned {
        mut session,
        child,
        mut exits,
    } = spawned?;
    let exit = session.client.wait_exit(child, &mut exits)?;
    let marks = child_timings(&mut session.client, child);
    session.close();
    RELAY_DRAIN.wait_for(|| out.0.is_finished() && err.0.is_finished());
    let text = |(_, buf): &(std::thread::JoinHandle<()>, Arc<Mutex<Vec<u8>>>)| {
        buf.lock()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    let mut doc = serde_json::json!({
        "exit_code": exit.code(),
        "signal": exit.signal(),
        "stdout": text(&out),
        "stderr": text(&err),
    });
    if let Some(marks) = marks {
        doc["timings"] = timings::document(&marks);
    }
    crate::console::output::json(&doc)?;
    Ok(exit_status(&exit))
}

fn status(json: bool) -> anyhow::Result<ExitCode> {
    let report = SandboxReport::probe();
    if json {
        crate::console::output::json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("level: {:?} ({})", report.level, report.backend);
    let mut table = crate::console::output::Table::new(&["LAYER", "AVAILABLE", "DETAIL"]);
    for (name, l) in [
        ("namespaces", &report.namespaces),
        ("landlock", &report.landlock),
        ("seccomp", &report.seccomp),
        ("cgroup", &report.cgroup),
        ("uid", &report.uid_switch),
        ("nnp", &report.no_new_privs),
    ] {
        let available = if l.available { "yes" } else { "NO" };
        table.row(vec![name.into(), available.into(), l.detail.clone()]);
    }
    table.print()?;
    for m in &report.missing {
        println!("missing: {m}");
    }
    println!(
        "strict mode {} this host",
        if Isolation::Strict.accepts(report.level) {
            "accepts"
        } else {
            "REFUSES children on"
        }
    );
    Ok(ExitCode::SUCCESS)
}

fn verify(role: &str, isolation: &str, json: bool) -> anyhow::Result<ExitCode> {
    let isolation: Isolation = isolation.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    let report = crate::verify::run(isolation, role, |r| {
        if json {
            return;
        }
        let verdict = match &r.verdict {
            Verdict::Blocked { .. } => "blocked".to_string(),
            Verdict::Escaped { .. } => "ESCAPED".to_string(),
            Verdict::Skipped { reason } => {
                format!("skipped: {}", crate::console::output::text(reason))
            }
        };
        let detail = match &r.verdict {
            // Evidence quotes what a probe child saw or printed.
            Verdict::Blocked { evidence } | Verdict::Escaped { evidence } => {
                format!(" ({})", crate::console::output::text(evidence))
            }
            Verdict::Skipped { .. } => String::new(),
        };
        println!(
            "{verdict:<8} #{:02} {:<28} {}{detail}",
            r.number, r.id, r.title
        );
    })?;
    if json {
        crate::console::output::json(&serde_json::json!({
            "ok": report.ok(),
            "report": report,
        }))?;
    } else {
        println!(
            "{} blocked, {} escaped, {} skipped",
            report.blocked, report.escaped, report.skipped
        );
        for f in &report.failures {
            crate::console::style::eprint_error(&format!("sandbox verify failed: {f}"));
        }
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
