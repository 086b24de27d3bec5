//! `mini-letta memory …`

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Cli, output};
use crate::agent::store;
use crate::memfs::compiler::{CORE_MEMORY_VARIABLE, CompileOptions, compile_dir};
use crate::memfs::layout::{MemoryFormat, role_of};
use crate::memfs::snapshot::read_head;
use crate::memfs::{pathrules, repo};

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Compile a memory repository's HEAD and print coreMemory (exact bytes).
    ///
    /// Reads only what is committed at HEAD. memfs-v2 (root MEMORY.md) renders
    /// root files and first-level indexes; memfs-v1 renders letta-code's
    /// layout with a <memory_metadata> block built from the options below.
    Compile(CompileArgs),
    /// Print a file as committed at HEAD.
    Show {
        #[command(flatten)]
        target: AgentArg,
        /// Repository-relative path, e.g. persona.md or projects/MEMORY.md.
        path: String,
    },
    /// List HEAD's paths with their role (core, root-index, directory-index,
    /// on-demand, unindexed, skill, other).
    Tree {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"format", "revision", "entries": [{"path", "role", "bytes"}]}.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct AgentArg {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    pub agent: Option<String>,
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
    match cmd {
        MemoryCommand::Compile(args) => compile(cli, args),
        MemoryCommand::Show { target, path } => show(cli, target, path),
        MemoryCommand::Tree { target, json } => tree(cli, target, *json),
    }
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
        Some(s) => OffsetDateTime::parse(s, &Rfc3339)
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
    let compiled = compile_dir(&memory_dir, &opts)?;
    if args.json {
        output::json(&compiled)?;
    } else {
        output::raw(compiled.core_memory.as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn show(cli: &Cli, target: &AgentArg, path: &str) -> anyhow::Result<ExitCode> {
    let (_, paths) = store::find(&cli.home()?, target.agent.as_deref())?;
    let path = pathrules::check_relative(path)?;
    let repo = repo::open(&paths.memory_dir())?;
    let head = read_head(&repo)?.context("the memory repository has no commit yet")?;
    let entry = head
        .find(&path)?
        .with_context(|| format!("{path}: no such file at HEAD"))?;
    output::raw(&head.read_bytes(&entry)?)?;
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
    let repo = repo::open(&paths.memory_dir())?;
    let head = read_head(&repo)?.context("the memory repository has no commit yet")?;
    let blobs = head.all_blobs()?;
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
        for e in &entries {
            println!("{:<16} {}", e.role, e.path);
        }
    }
    Ok(ExitCode::SUCCESS)
}
