//! `mini-letta memory …`: the subcommands ([`args`]); here, those that
//! read the repository; [`validate`] and the ones that commit ([`write`])
//! in files of their own.

pub(crate) mod args;
mod validate;
pub(crate) mod write;

use std::collections::HashSet;
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde::Serialize;
use time::OffsetDateTime;

use super::globals::Globals;
use crate::console::output;
use crate::memfs::compiler::{CORE_MEMORY_VARIABLE, CompileOptions, compile_dir, compile_repo};
use crate::memfs::frontmatter::{FrontmatterValue, parse_frontmatter};
use crate::memfs::layout::{MemoryFormat, role_of};
use crate::memfs::ops;
use crate::memfs::snapshot::read_head;
use crate::memfs::validate::{CONFIG_PATH, Glob, parse_config};
use crate::memfs::{pathrules, repo};
use crate::protocol::timings;
use crate::store;
use args::{AgentArg, CompileArgs, MemoryCommand};
use validate::validate_cmd;
use write::{commit_loop, read_body_file, write_op};

pub fn run(cli: &Globals, cmd: &MemoryCommand) -> anyhow::Result<ExitCode> {
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

fn run_command(cli: &Globals, cmd: &MemoryCommand) -> anyhow::Result<ExitCode> {
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

fn log(
    cli: &Globals,
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

fn diff(
    cli: &Globals,
    target: &AgentArg,
    rev: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
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

fn compile(cli: &Globals, args: &CompileArgs) -> anyhow::Result<ExitCode> {
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

fn show(cli: &Globals, target: &AgentArg, path: &str, json: bool) -> anyhow::Result<ExitCode> {
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
fn status(cli: &Globals, target: &AgentArg, json: bool) -> anyhow::Result<ExitCode> {
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

fn tree(cli: &Globals, target: &AgentArg, json: bool) -> anyhow::Result<ExitCode> {
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
