//! `mini-letta memory …`

use crate::protocol::timings;
use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde::Serialize;
use time::OffsetDateTime;

use super::{Cli, output};
use crate::memfs::commit::{CommitOptions, CommitOutcome};
use crate::memfs::compiler::{CORE_MEMORY_VARIABLE, CompileOptions, compile_dir, compile_repo};
use crate::memfs::frontmatter::{FrontmatterValue, parse_frontmatter};
use crate::memfs::hook::{self, EnsureMode};
use crate::memfs::layout::{MemoryFormat, role_of};
use crate::memfs::ops::{self, OpError, Writer};
use crate::memfs::snapshot::read_head;
use crate::memfs::validate::{
    CONFIG_PATH, Glob, TreeSnapshot, ValidateError, ValidateOptions, audit_revision,
    constraints_update_approved_from_env, parse_config, validate,
};
use crate::memfs::{pathrules, repo};
use crate::store;

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Compile a memory repository's HEAD and print coreMemory (exact bytes).
    ///
    /// Reads only what is committed at HEAD. memfs-v2 (root MEMORY.md) renders
    /// root files and first-level indexes; memfs-v1 renders letta-code's
    /// layout with a <memory_metadata> block built from the options below.
    /// Exact bytes in a pipe; on a terminal, control characters are shown
    /// visibly (`^[`, `\u{7}`).
    #[command(after_help = "Examples:
  mini-letta memory compile -a owl
  mini-letta memory compile --memory-dir ./memory --json
  mini-letta memory compile --memory-dir ./memory --now 2026-01-01T00:00:00Z")]
    Compile(CompileArgs),
    /// Print a file as committed at HEAD (exact bytes), or with --json its
    /// frontmatter and body.
    ///
    /// Exact bytes in a pipe; on a terminal, control characters are shown
    /// visibly (`^[`, `\u{7}`) so a file cannot drive it.
    #[command(after_help = "Examples:
  mini-letta memory show persona.md
  mini-letta memory show -a owl projects/MEMORY.md --json")]
    Show {
        #[command(flatten)]
        target: AgentArg,
        /// Repository-relative path, e.g. persona.md or projects/MEMORY.md.
        path: String,
        /// Print {"path", "revision", "role", "bytes", "description",
        /// "read_only", "frontmatter", "body", "content"} (role as in
        /// `memory tree`; read_only from the frontmatter's `read_only`).
        #[arg(long)]
        json: bool,
    },
    /// List HEAD's paths with their role (core, root-index, directory-index,
    /// on-demand, unindexed, skill, other).
    #[command(after_help = "Examples:
  mini-letta memory tree
  mini-letta memory tree -a owl --json")]
    Tree {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"format", "revision", "entries": [{"path", "role", "bytes"}]}.
        #[arg(long)]
        json: bool,
    },
    /// The uncommitted changes of an agent's memory: every path whose
    /// working-tree file differs from HEAD (modified, added, deleted,
    /// untracked), as the supervisor sees them. An agent commits them with
    /// its memory tool (`commit`); you with `memory commit`.
    #[command(after_help = "Examples:
  mini-letta memory status
  mini-letta memory status -a owl --json")]
    Status {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "head", "dirty": [path, …]}.
        #[arg(long)]
        json: bool,
    },
    /// Validate the staged tree (default) or a revision with the MemFS
    /// validator; exit 0 when valid, 1 with the validator's block on stderr
    /// when not, 2 when the repository cannot be read. This is what the
    /// pre-commit hook runs. MINI_LETTA_CONSTRAINTS_UPDATE=1 approves a
    /// change to .memfs.config.json.
    #[command(after_help = "Examples:
  mini-letta memory validate
  mini-letta memory validate --rev HEAD~1 --json
  mini-letta memory validate --memory-dir ./memory")]
    Validate(ValidateArgs),
    /// Create a memory file with `name` (from the file name) and
    /// `description` frontmatter, and commit it.
    #[command(after_help = "Examples:
  mini-letta memory create projects/garden.md --description 'The garden project.'
  mini-letta memory create -a owl notes.md --description 'Loose notes.' --body '- first'")]
    Create {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative path ending in .md, e.g. projects/notes.md.
        path: String,
        /// One-line description (frontmatter `description`).
        #[arg(long, value_name = "D", allow_hyphen_values = true)]
        description: String,
        /// Text below the frontmatter.
        #[arg(long, value_name = "B", default_value = "", allow_hyphen_values = true)]
        body: String,
        /// Read the text below the frontmatter from file F (`-`: standard
        /// input) instead of --body: for a body too long for a command line.
        #[arg(long, value_name = "F", conflicts_with = "body")]
        body_file: Option<PathBuf>,
    },
    /// Replace the first occurrence of --old in a file's body with --new and
    /// commit; an empty --new deletes every body line containing --old.
    #[command(after_help = "Examples:
  mini-letta memory replace human.md --old 'likes tea' --new 'likes coffee'
  mini-letta memory replace human.md --old 'outdated' --new ''")]
    Replace {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative path of the file to edit.
        path: String,
        /// The text to find (its first occurrence in the body).
        #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
        old: String,
        /// The text to put in its place (empty: delete the lines holding --old).
        #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
        new: String,
    },
    /// Insert text into a file's body (before body line N, or at the end) and commit.
    #[command(after_help = "Examples:
  mini-letta memory insert human.md --text '- likes tea'
  mini-letta memory insert -a owl persona.md --text '- speaks plainly' --line 1")]
    Insert {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative path of the file to edit.
        path: String,
        /// The text to insert (one or more lines).
        #[arg(long, value_name = "T", allow_hyphen_values = true)]
        text: String,
        /// 1-based body line to insert before, from 1 to the body's line
        /// count + 1 (which appends) [default: append].
        #[arg(long, value_name = "N")]
        line: Option<usize>,
    },
    /// Delete a file and commit.
    #[command(after_help = "Examples:
  mini-letta memory delete projects/old.md")]
    Delete {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative path of the file to delete.
        path: String,
    },
    /// Move a file and commit both paths.
    #[command(after_help = "Examples:
  mini-letta memory rename facts.md projects/facts.md")]
    Rename {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// The file's current repository-relative path.
        from: String,
        /// Its new repository-relative path.
        to: String,
    },
    /// Set a file's frontmatter `description` and commit.
    #[command(after_help = "Examples:
  mini-letta memory set-description human.md --description 'About the human.'")]
    SetDescription {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative path of the file.
        path: String,
        /// The new one-line description.
        #[arg(long, value_name = "D", allow_hyphen_values = true)]
        description: String,
    },
    /// Commit edits already made in the working tree to exactly these paths
    /// (added, modified or deleted; directories included), as `git commit --
    /// PATHS`: nothing else that is staged rides along.
    #[command(after_help = "Examples:
  mini-letta memory commit -m 'persona: plainer' persona.md
  mini-letta memory commit -a owl -m 'notes' notes/")]
    Commit {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative paths (files or directories) to commit.
        #[arg(required = true)]
        paths: Vec<String>,
        /// The commit message.
        #[arg(short = 'm', long = "message", value_name = "MSG")]
        message: String,
    },
    /// HEAD's history, newest first, optionally only commits touching PATH.
    #[command(after_help = "Examples:
  mini-letta memory log
  mini-letta memory log -n 5 human.md
  mini-letta memory log -a owl --json")]
    Log {
        #[command(flatten)]
        target: AgentArg,
        /// Only commits that changed this file or directory.
        path: Option<String>,
        /// At most N commits.
        #[arg(short = 'n', long = "max-count", value_name = "N")]
        max_count: Option<usize>,
        /// Print {"entries": [{id, parents, author, email, time, summary, message}]}.
        #[arg(long)]
        json: bool,
    },
    /// Unified diff of the working tree (untracked files included) against
    /// REV [default: HEAD].
    ///
    /// Exact bytes in a pipe (for `git apply`); on a terminal, control
    /// characters are shown visibly (`^[`, `\u{7}`).
    #[command(after_help = "Examples:
  mini-letta memory diff
  mini-letta memory diff HEAD~2 --json")]
    Diff {
        #[command(flatten)]
        target: AgentArg,
        /// The revision to compare with (a commit id, HEAD~N, a branch) [default: HEAD].
        rev: Option<String>,
        /// Print {"revision", "files": [{path, status}], "patch"}.
        #[arg(long)]
        json: bool,
    },
    /// Stress the validated commit: rewrite PATH and commit it COUNT times
    /// (with --reject-every K, also attempt an invalid write every K
    /// iterations, which must be refused), then print {"committed",
    /// "rejected", "millis"}. Run two at once to check concurrent writers.
    #[command(after_help = "Examples:
  mini-letta memory commit-loop --path stress.md --count 100
  mini-letta memory commit-loop -a owl --path stress.md --count 50 --reject-every 10")]
    CommitLoop {
        #[command(flatten)]
        target: AgentArg,
        /// Repository-relative path of the file rewritten each time.
        #[arg(long, value_name = "PATH")]
        path: String,
        /// How many valid commits to make.
        #[arg(long, value_name = "N")]
        count: usize,
        /// Also attempt an invalid write every K iterations (must be refused).
        #[arg(long, value_name = "K")]
        reject_every: Option<usize>,
    },
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The memory repository's working tree (default: the agent's).
    #[arg(long, value_name = "DIR", conflicts_with = "agent")]
    memory_dir: Option<PathBuf>,
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// Validate the staged index ($GIT_INDEX_FILE when set) against HEAD (the default).
    #[arg(long, conflicts_with = "rev")]
    staged: bool,
    /// Audit a committed revision against its own config instead.
    #[arg(long, value_name = "REV")]
    rev: Option<String>,
    /// Print {"ok", "mode", "policy", "block", "violations": [{path, message, rule}]}.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct AgentArg {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    pub agent: Option<String>,
    /// When the command ends, print where its time went (the steps of
    /// this process and of the commit, on the monotonic clock) as a table
    /// on stderr.
    #[arg(long)]
    pub timings: bool,
}

#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The memory repository (working tree or git directory).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "agent",
        conflicts_with = "agent"
    )]
    memory_dir: Option<PathBuf>,
    /// Compile this agent's memory with its id and system prompt.
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    agent: Option<String>,
    /// AGENT_ID in the memfs-v1 metadata block [default: the agent's id, else agent-local].
    #[arg(long, value_name = "ID")]
    agent_id: Option<String>,
    /// CONVERSATION_ID in the memfs-v1 metadata block.
    #[arg(long, value_name = "ID", default_value = "default")]
    conversation_id: String,
    /// Compilation time (RFC 3339) [default: now].
    #[arg(long, value_name = "RFC3339")]
    now: Option<String>,
    /// Messages already in recall memory (memfs-v1 metadata).
    #[arg(long, value_name = "N", default_value_t = 0)]
    message_count: u64,
    /// Raw system prompt [default: the agent's, else "{CORE_MEMORY}"].
    #[arg(long, value_name = "TEXT", conflicts_with = "system_file")]
    system: Option<String>,
    /// Read the raw system prompt from a file.
    #[arg(long, value_name = "F")]
    system_file: Option<PathBuf>,
    /// Print {content, coreMemory, compiledAt, rawSystemHash, memfsRevision, memoryFormat}.
    #[arg(long)]
    json: bool,
}

pub fn run(cli: &Cli, cmd: &MemoryCommand) -> anyhow::Result<ExitCode> {
    let timed = target_of(cmd).is_some_and(|t| t.timings);
    if timed {
        timings::enable_from_start("cli.main");
    }
    let result = run_command(cli, cmd);
    if timed {
        timings::mark("cli.done");
        eprint!("{}", timings::table(&timings::taken()));
    }
    result
}

/// The agent a command acts on, for those that name one.
fn target_of(cmd: &MemoryCommand) -> Option<&AgentArg> {
    match cmd {
        MemoryCommand::Compile(_) | MemoryCommand::Validate(_) => None,
        MemoryCommand::Show { target, .. }
        | MemoryCommand::Tree { target, .. }
        | MemoryCommand::Status { target, .. }
        | MemoryCommand::Create { target, .. }
        | MemoryCommand::Replace { target, .. }
        | MemoryCommand::Insert { target, .. }
        | MemoryCommand::Delete { target, .. }
        | MemoryCommand::Rename { target, .. }
        | MemoryCommand::SetDescription { target, .. }
        | MemoryCommand::Commit { target, .. }
        | MemoryCommand::Log { target, .. }
        | MemoryCommand::Diff { target, .. }
        | MemoryCommand::CommitLoop { target, .. } => Some(target),
    }
}

fn run_command(cli: &Cli, cmd: &MemoryCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        MemoryCommand::Compile(args) => compile(cli, args),
        MemoryCommand::Show { target, path, json } => show(cli, target, path, *json),
        MemoryCommand::Tree { target, json } => tree(cli, target, *json),
        MemoryCommand::Status { target, json } => status(cli, target, *json),
        MemoryCommand::Validate(args) => Ok(validate_cmd(cli, args)),
        MemoryCommand::Create {
            target,
            json,
            path,
            description,
            body,
            body_file,
        } => {
            let body = match body_file {
                Some(f) => read_body_file(f)?,
                None => body.clone(),
            };
            write_op(cli, target, *json, "create", |w| {
                w.create(path, description, &body)
            })
        }
        MemoryCommand::Replace {
            target,
            json,
            path,
            old,
            new,
        } => write_op(cli, target, *json, "replace", |w| w.replace(path, old, new)),
        MemoryCommand::Insert {
            target,
            json,
            path,
            text,
            line,
        } => write_op(cli, target, *json, "insert", |w| {
            w.insert(path, text, *line)
        }),
        MemoryCommand::Delete { target, json, path } => {
            write_op(cli, target, *json, "delete", |w| w.delete(path))
        }
        MemoryCommand::Rename {
            target,
            json,
            from,
            to,
        } => write_op(cli, target, *json, "rename", |w| w.rename(from, to)),
        MemoryCommand::SetDescription {
            target,
            json,
            path,
            description,
        } => write_op(cli, target, *json, "set-description", |w| {
            w.set_description(path, description)
        }),
        MemoryCommand::Commit {
            target,
            json,
            paths,
            message,
        } => {
            // `notes/` as a shell completes a directory means `notes`.
            let paths: Vec<String> = paths
                .iter()
                .map(|p| match p.strip_suffix('/') {
                    Some(dir) if !dir.is_empty() => dir.to_string(),
                    _ => p.clone(),
                })
                .collect();
            write_op(cli, target, *json, "commit", |w| w.commit(&paths, message))
        }
        MemoryCommand::Log {
            target,
            path,
            max_count,
            json,
        } => log(cli, target, path.as_deref(), *max_count, *json),
        MemoryCommand::Diff { target, rev, json } => diff(cli, target, rev.as_deref(), *json),
        MemoryCommand::CommitLoop {
            target,
            path,
            count,
            reject_every,
        } => commit_loop(cli, target, path, *count, *reject_every),
    }
}

/// Exit code of `memory validate` when the repository cannot be judged.
const EXIT_CANNOT_VALIDATE: u8 = 2;

fn validate_cmd(cli: &Cli, args: &ValidateArgs) -> ExitCode {
    match validate_inner(cli, args) {
        Ok(code) => code,
        Err(e) => {
            super::style::eprint_error(&super::one_line(&e));
            ExitCode::from(EXIT_CANNOT_VALIDATE)
        }
    }
}

#[derive(Serialize)]
struct ViolationJson<'a> {
    path: Option<&'a str>,
    message: &'a str,
    rule: &'static str,
}

fn validate_inner(cli: &Cli, args: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let memory_dir = match &args.memory_dir {
        Some(d) => d.clone(),
        None => store::find(&cli.home()?, args.agent.as_deref())?
            .1
            .memory_dir(),
    };
    let repo = repo::open(&memory_dir)?;
    let git_dir = hook::common_git_dir(&repo).to_path_buf();
    // Keep an installed hook of ours pointing at this binary; never plant
    // one in a repository that has none.
    if let Some(bin) = hook::self_binary()
        && let Err(e) = hook::ensure(&git_dir, &bin, EnsureMode::RefreshOnly)
    {
        super::style::eprint_warning(&e.to_string());
    }
    let opts = ValidateOptions::new(hook::read_layout_policy(&git_dir))
        .with_approval(constraints_update_approved_from_env());
    let (mode, report, block) = match &args.rev {
        Some(rev) => {
            let report = audit_revision(&repo, rev, &opts).map_err(validate_error)?;
            let block = report.render_audit();
            ("rev", report, block)
        }
        None => {
            // Git runs the hook with GIT_INDEX_FILE naming the index to
            // commit (a temporary one for `git commit -- paths` or `-a`).
            let index = match std::env::var_os("GIT_INDEX_FILE").filter(|v| !v.is_empty()) {
                Some(f) => git2::Index::open(std::path::Path::new(&f))
                    .with_context(|| format!("cannot read the index {}", f.to_string_lossy()))?,
                None => repo.index().context("cannot read the index")?,
            };
            let candidate = TreeSnapshot::from_index(&index).map_err(validate_error)?;
            let head = TreeSnapshot::from_head(&repo).map_err(validate_error)?;
            let report =
                validate(&repo, &candidate, head.as_ref(), &opts).map_err(validate_error)?;
            let block = report.render_block();
            ("staged", report, block)
        }
    };
    if args.json {
        let violations: Vec<ViolationJson<'_>> = report
            .violations
            .iter()
            .map(|v| ViolationJson {
                path: v.path.as_deref(),
                message: &v.message,
                rule: v.rule.as_str(),
            })
            .collect();
        output::json(&serde_json::json!({
            "ok": report.is_ok(),
            "mode": mode,
            "policy": report.policy.as_str(),
            "block": block,
            "violations": violations,
        }))?;
    } else if !report.is_ok() {
        eprint!("{}", output::text_block(&block));
    }
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn validate_error(e: ValidateError) -> anyhow::Error {
    anyhow::anyhow!("{}", e.render().trim_end())
}

/// The agent's writer: its repository, its signature, policy and approval
/// from the repository and environment, and the hook kept current.
fn writer(cli: &Cli, target: &AgentArg) -> anyhow::Result<Writer> {
    let (record, paths) = store::find(&cli.home()?, target.agent.as_deref())?;
    timings::mark("cli.agent_found");
    writer_for(&record, &paths)
}

fn writer_for(
    record: &store::record::AgentRecord,
    paths: &crate::paths::AgentPaths,
) -> anyhow::Result<Writer> {
    let repo = repo::open_agent(paths)?;
    timings::mark("cli.repo_open");
    let author = store::agent_signature(record)?;
    let opts = CommitOptions::from_env(&repo);
    Ok(Writer::new(repo, author, opts)?)
}

/// With a supervisor running, its children may be editing this agent's
/// memory: take the agent's memory lease for the length of the edit and
/// commit (it ends with the returned connection).
fn lease(
    home: &crate::paths::Home,
    agent: &str,
) -> anyhow::Result<Option<crate::protocol::client::Client>> {
    let Ok(mut client) = crate::supervisor::connect(home) else {
        return Ok(None);
    };
    timings::mark("cli.connected");
    client
        .call_as::<crate::protocol::replies::Leased>(crate::protocol::Call::MemoryLease {
            agent: Some(agent.to_string()),
        })
        .context("cannot take the agent's memory lease from the supervisor")?;
    timings::mark("cli.lease_taken");
    Ok(Some(client))
}

/// Set block `label` (`LABEL.md`) of a new agent to `text`, committed
/// as the memory commands commit (letta-code's `--block-value`).
pub(crate) fn set_block(
    home: &crate::paths::Home,
    record: &store::record::AgentRecord,
    label: &str,
    text: &str,
) -> anyhow::Result<()> {
    let path = pathrules::check_relative(&format!("{label}.md"))?;
    let (record, paths) = store::find(home, Some(&record.id))?;
    let _lease = lease(home, &record.id)?;
    let w = writer_for(&record, &paths)?;
    let exists = paths.memory_dir().join(&path).is_file();
    let done = if exists {
        w.set_body(&path, text)
    } else {
        w.create(&path, label, text)
    };
    done.map_err(|e| anyhow::anyhow!("--block-value {label}: {e}"))?;
    Ok(())
}

/// Run one write operation; a refusal prints the validator's block.
/// The body `memory create --body-file F` names (`-`: standard input),
/// read up to one byte past what a memory file may hold so that an
/// oversized one is refused by the validator, not truncated.
fn read_body_file(f: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    let limit = crate::memfs::validate::MAX_FILE_BYTES + 1;
    let mut bytes = Vec::new();
    let read = if f == std::path::Path::new("-") {
        std::io::stdin().lock().take(limit).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(f).and_then(|file| file.take(limit).read_to_end(&mut bytes))
    };
    read.with_context(|| format!("--body-file {}", f.display()))?;
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("--body-file {}: not UTF-8 text", f.display()))
}

fn write_op(
    cli: &Cli,
    target: &AgentArg,
    json: bool,
    op: &str,
    f: impl FnOnce(&Writer) -> Result<CommitOutcome, OpError>,
) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let (record, paths) = store::find(&home, target.agent.as_deref())?;
    timings::mark("cli.agent_found");
    let _lease = lease(&home, &record.id)?;
    let w = writer_for(&record, &paths)?;
    timings::mark("cli.writer_open");
    let done = f(&w);
    timings::mark("cli.op_done");
    match done {
        Ok(outcome) if json => {
            output::json(&serde_json::json!({
                "agent": record.id,
                "name": record.name,
                "op": op,
                "commit": outcome.commit.map(|c| c.to_string()),
                "changed": outcome.changed,
            }))?;
            Ok(ExitCode::SUCCESS)
        }
        Ok(outcome) => {
            match outcome.commit {
                Some(id) => {
                    let changed: Vec<_> =
                        outcome.changed.iter().map(|p| output::field(p)).collect();
                    println!("committed {id} ({})", changed.join(", "))
                }
                None => println!("nothing to commit: no changes"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => match e.report() {
            Some(report) => {
                if json {
                    output::json(&serde_json::json!({
                        "agent": record.id,
                        "name": record.name,
                        "op": op,
                        "commit": null,
                        "refused": true,
                        "violations": report.messages(),
                    }))?;
                }
                eprint!("{}", output::text_block(&report.render_for_operator()));
                super::style::eprint_error(&format!(
                    "memory {op}: refused by the memory validator; nothing was committed and the working tree is as before"
                ));
                Ok(ExitCode::FAILURE)
            }
            // Messages that already name the operation get no prefix.
            None if e.to_string().starts_with("memory ") => Err(e.into()),
            None => Err(anyhow::Error::new(e).context(format!("memory {op}"))),
        },
    }
}

fn log(
    cli: &Cli,
    target: &AgentArg,
    path: Option<&str>,
    max_count: Option<usize>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (_, paths) = store::find(&cli.home()?, target.agent.as_deref())?;
    let path = path.map(pathrules::check_relative).transpose()?;
    let repo = repo::open_agent(&paths)?;
    let entries = ops::log(&repo, path.as_deref(), max_count)?;
    if json {
        output::json(&serde_json::json!({ "entries": entries }))?;
    } else if !entries.is_empty() {
        let mut table = output::Table::new(&["COMMIT", "TIME", "AUTHOR", "SUMMARY"]);
        for e in &entries {
            table.row(vec![
                e.id.get(..10).unwrap_or(&e.id).to_string(),
                output::display_stored_time(&e.time),
                e.author.clone(),
                e.summary.clone(),
            ]);
        }
        table.print()?;
    }
    Ok(ExitCode::SUCCESS)
}

fn diff(cli: &Cli, target: &AgentArg, rev: Option<&str>, json: bool) -> anyhow::Result<ExitCode> {
    let (_, paths) = store::find(&cli.home()?, target.agent.as_deref())?;
    let repo = repo::open_agent(&paths)?;
    let d = ops::diff(&repo, rev)?;
    if json {
        output::json(&d)?;
    } else {
        output::content(d.patch.as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn commit_loop(
    cli: &Cli,
    target: &AgentArg,
    path: &str,
    count: usize,
    reject_every: Option<usize>,
) -> anyhow::Result<ExitCode> {
    let w = writer(cli, target)?;
    let rel = pathrules::check_relative(path)?;
    // The working tree is the agent's: written from its parent directory's
    // descriptor, never through a path a swapped symlink could redirect.
    let root = crate::agentfs::Dir::open(w.work_tree())?;
    let (dir, leaf) = root.open_parent(std::ffi::OsStr::new(&rel))?;
    let name = crate::memfs::template::name_from_label(path);
    let pid = std::process::id();
    let paths = [path.to_string()];
    let (mut committed, mut rejected) = (0usize, 0usize);
    let start = std::time::Instant::now();
    for i in 0..count {
        if reject_every.is_some_and(|k| k > 0 && i % k == 0) {
            dir.replace_file(
                leaf,
                format!("no frontmatter, iteration {i}\n").as_bytes(),
                0o644,
            )?;
            match w.commit(&paths, &format!("memory commit-loop: {path} invalid #{i}")) {
                Err(e) if e.report().is_some() => rejected += 1,
                Err(e) => return Err(e.into()),
                Ok(_) => bail!("{path}: an invalid write was committed at iteration {i}"),
            }
        }
        let text = format!(
            "---\nname: {name}\ndescription: Stress file.\n---\niteration {i} of process {pid}\n"
        );
        dir.replace_file(leaf, text.as_bytes(), 0o644)?;
        let outcome = w.commit(&paths, &format!("memory commit-loop: {path} #{i}"))?;
        if outcome.commit.is_none() {
            bail!("{path}: iteration {i} changed nothing");
        }
        committed += 1;
    }
    output::json(&serde_json::json!({
        "committed": committed,
        "rejected": rejected,
        "millis": start.elapsed().as_secs_f64() * 1000.0,
    }))?;
    Ok(ExitCode::SUCCESS)
}

fn compile(cli: &Cli, args: &CompileArgs) -> anyhow::Result<ExitCode> {
    let agent = match &args.agent {
        Some(sel) => Some(store::find(&cli.home()?, Some(sel))?),
        None => None,
    };
    let memory_dir = match (&args.memory_dir, &agent) {
        (Some(d), _) => d.clone(),
        (None, Some((_, paths))) => paths.memory_dir(),
        (None, None) => bail!("give --memory-dir DIR or -a AGENT"),
    };
    let system = match (&args.system, &args.system_file, &agent) {
        (Some(s), _, _) => s.clone(),
        (None, Some(f), _) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read system prompt file {}", f.display()))?,
        (None, None, Some((record, _))) => record.system.clone(),
        (None, None, None) => CORE_MEMORY_VARIABLE.to_string(),
    };
    let now = match &args.now {
        Some(s) => crate::clock::parse_rfc3339(s)
            .with_context(|| format!("--now {s:?} is not an RFC 3339 time"))?,
        None => OffsetDateTime::now_utc(),
    };
    let agent_id = match (&args.agent_id, &agent) {
        (Some(id), _) => id.clone(),
        (None, Some((record, _))) => record.id.clone(),
        (None, None) => "agent-local".to_string(),
    };
    let opts = CompileOptions {
        agent_id: &agent_id,
        conversation_id: &args.conversation_id,
        system: &system,
        now,
        previous_message_count: args.message_count,
    };
    // A read-only, one-shot compile: skip re-hashing every object read
    // (corrupt objects still fail to inflate or parse and are reported).
    git2::opts::strict_hash_verification(false);
    // An agent's repository is opened by its git directory (its working
    // tree may belong to the agent's uid); a plain directory as given.
    let compiled = match (&args.memory_dir, &agent) {
        (None, Some((_, paths))) => compile_repo(&repo::open_agent(paths)?, &opts)?,
        _ => compile_dir(&memory_dir, &opts)?,
    };
    if args.json {
        output::json(&compiled)?;
    } else {
        output::content(compiled.core_memory.as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn show(cli: &Cli, target: &AgentArg, path: &str, json: bool) -> anyhow::Result<ExitCode> {
    let (_, paths) = store::find(&cli.home()?, target.agent.as_deref())?;
    timings::mark("cli.agent_found");
    let path = pathrules::check_relative(path)?;
    let repo = repo::open_agent(&paths)?;
    timings::mark("cli.repo_open");
    let head = read_head(&repo)?.context("the memory repository has no commit yet")?;
    timings::mark("cli.head_read");
    let entry = head
        .find(&path)?
        .with_context(|| format!("{path}: no such file at HEAD"))?;
    let bytes = head.read_bytes(&entry)?;
    if !json {
        output::content(&bytes)?;
        return Ok(ExitCode::SUCCESS);
    }
    let content = String::from_utf8_lossy(&bytes);
    let parsed = parse_frontmatter(&content);
    let frontmatter: serde_json::Map<String, serde_json::Value> = parsed
        .fields
        .iter()
        .map(|(k, v)| {
            let value = match v {
                FrontmatterValue::Text(t) => serde_json::json!(t),
                FrontmatterValue::List(items) => serde_json::json!(items),
            };
            (k.clone(), value)
        })
        .collect();
    let format = if head.has_root_index() {
        MemoryFormat::V2
    } else {
        MemoryFormat::V1
    };
    let role = role_of(&path, format, |p| matches!(head.find(p), Ok(Some(_))));
    output::json(&serde_json::json!({
        "path": path,
        "revision": head.revision().to_string(),
        "role": role.as_str(),
        "bytes": bytes.len(),
        "description": parsed.description(),
        "read_only": read_only_at_head(&head, &path),
        "frontmatter": frontmatter,
        "body": parsed.body,
        "content": content,
    }))?;
    Ok(ExitCode::SUCCESS)
}

/// Whether HEAD's `.memfs.config.json` lists `path` in `readOnlyFiles`
/// (an unreadable or invalid config lists nothing).
fn read_only_at_head(head: &crate::memfs::snapshot::Head<'_>, path: &str) -> bool {
    let Ok(Some(entry)) = head.find(CONFIG_PATH) else {
        return false;
    };
    let Ok(bytes) = head.read_bytes(&entry) else {
        return false;
    };
    let Ok(config) = parse_config(&String::from_utf8_lossy(&bytes)) else {
        return false;
    };
    config
        .read_only_files
        .iter()
        .any(|g| Glob::new(g).is_match(path))
}

/// `memory status`: the checkout's uncommitted paths, read through
/// descriptors as the supervisor reads them (never libgit2's status,
/// which opens the agent's files by path).
fn status(cli: &Cli, target: &AgentArg, json: bool) -> anyhow::Result<ExitCode> {
    let (record, paths) = store::find(&cli.home()?, target.agent.as_deref())?;
    timings::mark("cli.agent_found");
    let repo = repo::open_agent(&paths)?;
    timings::mark("cli.repo_open");
    let st = crate::memfs::status::worktree_status(&repo)
        .with_context(|| format!("cannot read {}", paths.memory_dir().display()))?;
    timings::mark("cli.status_read");
    if json {
        output::json(&serde_json::json!({
            "agent": record.id,
            "name": record.name,
            "head": st.head,
            "dirty": st.dirty,
            "changes": st.changes,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let head = st.head.as_deref().map_or("no commit yet".to_string(), |h| {
        format!("HEAD {}", h.chars().take(7).collect::<String>())
    });
    if st.dirty.is_empty() {
        println!(
            "{}: no uncommitted changes ({head})",
            output::field(&record.name)
        );
    } else {
        println!(
            "{}: {} uncommitted change(s) ({head}):",
            output::field(&record.name),
            st.dirty.len()
        );
        for c in &st.changes {
            println!("  {:<10} {}", c.kind, output::field(&c.path));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct TreeEntry {
    path: String,
    role: &'static str,
    bytes: usize,
}

fn tree(cli: &Cli, target: &AgentArg, json: bool) -> anyhow::Result<ExitCode> {
    let (_, paths) = store::find(&cli.home()?, target.agent.as_deref())?;
    timings::mark("cli.agent_found");
    let repo = repo::open_agent(&paths)?;
    timings::mark("cli.repo_open");
    let head = read_head(&repo)?.context("the memory repository has no commit yet")?;
    let blobs = head.all_blobs()?;
    timings::mark("cli.head_read");
    let format = if head.has_root_index() {
        MemoryFormat::V2
    } else {
        MemoryFormat::V1
    };
    let all: HashSet<&str> = blobs.iter().map(|e| e.path.as_str()).collect();
    let mut entries = Vec::new();
    for e in &blobs {
        let size = repo
            .find_blob(e.oid)
            .map(|b| b.size())
            .with_context(|| format!("{}: unreadable object {}", e.path, e.oid))?;
        entries.push(TreeEntry {
            role: role_of(&e.path, format, |p| all.contains(p)).as_str(),
            path: e.path.clone(),
            bytes: size,
        });
    }
    if json {
        output::json(&serde_json::json!({
            "format": format,
            "revision": head.revision().to_string(),
            "entries": entries,
        }))?;
    } else {
        println!("{} at {}", format.as_str(), head.revision());
        let mut table = output::Table::new(&["ROLE", "BYTES", "PATH"]).right(1);
        for e in &entries {
            table.row(vec![
                e.role.to_string(),
                e.bytes.to_string(),
                e.path.clone(),
            ]);
        }
        table.print()?;
    }
    Ok(ExitCode::SUCCESS)
}
