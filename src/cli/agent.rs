//! `mini-letta agent …`

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;

use super::{Cli, output};
use crate::agent::store;

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Create an agent with a fresh memory repository (memfs-v2 layout).
    #[command(after_help = "Examples:
  mini-letta agent create owl
  mini-letta agent create owl --system-file system.md --json
  mini-letta agent create owl --disk-mb 512 --inodes 20000")]
    Create {
        /// A unique, human-readable name.
        name: String,
        /// Read the raw system prompt from this file (may contain {CORE_MEMORY}).
        #[arg(long, value_name = "F")]
        system_file: Option<PathBuf>,
        /// Disk quota in MB: the agent's directory becomes a volume of its
        /// own this size (needs root; default: `[quota] disk_mb` in
        /// config.toml, else none). Writes past it fail with ENOSPC.
        #[arg(long, value_name = "MB")]
        disk_mb: Option<u64>,
        /// Inode quota (how many files and directories the agent may have;
        /// default: `[quota] inodes`, else 64 per MB).
        #[arg(long, value_name = "N")]
        inodes: Option<u64>,
        /// Print the new agent's record as JSON ({"id", "name", "model",
        /// "created_at", "system", …}).
        #[arg(long)]
        json: bool,
    },
    /// Delete an agent for good: its memory, conversations and files, its
    /// quota volume, and its sandbox uid (the only way a uid is freed).
    /// Refused while any of its children run.
    #[command(after_help = "Examples:
  mini-letta agent delete owl --yes
  mini-letta agent delete agent-1_x --yes --json")]
    Delete {
        /// Agent id or name.
        agent: String,
        /// Yes, delete it (required: nothing of it can be recovered).
        #[arg(long)]
        yes: bool,
        /// Print {"deleted", "name", "uid_freed", "volume_removed"}.
        #[arg(long)]
        json: bool,
    },
    /// List agents, oldest first.
    #[command(after_help = "Examples:
  mini-letta agent list
  mini-letta agent list --json")]
    List {
        /// Print {"agents": [...]} instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one agent's record and where its files are.
    #[command(after_help = "Examples:
  mini-letta agent show
  mini-letta agent show owl
  mini-letta agent show -a owl --json")]
    Show {
        /// Agent id or name (default: the only agent).
        agent: Option<String>,
        /// Agent id or name (same as the positional argument).
        #[arg(
            short = 'a',
            long = "agent",
            value_name = "AGENT",
            conflicts_with = "agent"
        )]
        agent_flag: Option<String>,
        /// Print the agent's record as JSON, with "dir" and "memory_dir" added.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cli: &Cli, cmd: &AgentCommand) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    match cmd {
        AgentCommand::Create {
            name,
            system_file,
            disk_mb,
            inodes,
            json,
        } => {
            let system =
                match system_file {
                    Some(f) => Some(std::fs::read_to_string(f).with_context(|| {
                        format!("cannot read system prompt file {}", f.display())
                    })?),
                    None => None,
                };
            let default = crate::sandbox::volume::default_quota(&home)?;
            let quota = match (disk_mb, inodes, default) {
                (None, None, d) => d,
                (disk, inodes, d) => {
                    let disk_mb = disk.or(d.map(|q| q.disk_mb)).unwrap_or(1024);
                    Some(crate::sandbox::volume::Quota {
                        disk_mb,
                        inodes: inodes
                            .or(d.map(|q| q.inodes))
                            .unwrap_or(disk_mb.saturating_mul(64)),
                    })
                }
            };
            let record = store::create_with_quota(&home, name, system, quota)?;
            if *json {
                output::json(&record)?;
            } else {
                println!("created agent {} ({})", record.name, record.id);
            }
        }
        AgentCommand::Delete { agent, yes, json } => delete(&home, agent, *yes, *json)?,
        AgentCommand::List { json } => {
            let agents = store::list(&home)?;
            if *json {
                output::json(&json!({ "agents": agents }))?;
            } else if agents.is_empty() {
                println!("no agents (create one with `mini-letta agent create NAME`)");
            } else {
                for a in &agents {
                    println!("{}  {}  {}  {}", a.id, a.name, a.model, a.created_at);
                }
            }
        }
        AgentCommand::Show {
            agent,
            agent_flag,
            json,
        } => {
            let selector = agent.as_deref().or(agent_flag.as_deref());
            let (record, paths) = store::find(&home, selector)?;
            let memory_dir = paths.memory_dir();
            if *json {
                let mut value = serde_json::to_value(&record)?;
                if let Some(obj) = value.as_object_mut() {
                    obj.insert("dir".into(), json!(paths.dir()));
                    obj.insert("memory_dir".into(), json!(memory_dir));
                }
                output::json(&value)?;
            } else {
                println!("id:         {}", record.id);
                println!("name:       {}", record.name);
                println!("model:      {}", record.model);
                println!("created:    {}", record.created_at);
                println!("directory:  {}", paths.dir().display());
                println!("memory:     {}", memory_dir.display());
                println!("system prompt ({} bytes):", record.system.len());
                for line in record.system.lines() {
                    println!("  {line}");
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn delete(home: &crate::paths::Home, agent: &str, yes: bool, json: bool) -> anyhow::Result<()> {
    let (record, paths) = store::find(home, Some(agent))?;
    if !yes {
        anyhow::bail!(
            "deleting agent {} ({}) removes its memory, conversations and files for good; \
             pass --yes to do it",
            record.name,
            record.id
        );
    }
    // A running supervisor may have children of this agent.
    if let Ok(mut client) = crate::supervisor::connect(home) {
        let rows = client.call(crate::protocol::Call::Ps {})?;
        let live: Vec<String> = rows["children"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| {
                r["agent"] == record.id.as_str()
                    && (r["state"] == "running" || r["state"] == "starting")
            })
            .map(|r| r["id"].to_string())
            .collect();
        if !live.is_empty() {
            anyhow::bail!(
                "agent {} has running children ({}); stop them first (mini-letta ps)",
                record.name,
                live.join(", ")
            );
        }
    }
    // Nothing is removed while a process of the agent's uid still runs.
    if let Some(uid) = record.sandbox_uid
        && let Some(pid) =
            crate::sandbox::identity::wait_uid_idle(uid, std::time::Duration::from_secs(3))
    {
        anyhow::bail!(
            "a process of agent {} still runs (pid {pid}, uid {uid}); stop it first",
            record.name
        );
    }
    let volume = crate::sandbox::volume::remove(home, &record.id)?;
    std::fs::remove_dir_all(paths.dir())
        .with_context(|| format!("cannot remove {}", paths.dir().display()))?;
    store::reindex(home);
    let uid_freed = match record.sandbox_uid {
        Some(uid) => crate::sandbox::identity::release_uid(home, &record.id, uid)?.then_some(uid),
        None => None,
    };
    if json {
        output::json(&json!({
            "deleted": record.id,
            "name": record.name,
            "uid_freed": uid_freed,
            "volume_removed": volume,
        }))?;
    } else {
        println!("deleted agent {} ({})", record.name, record.id);
        if let Some(uid) = uid_freed {
            println!("uid {uid} freed");
        }
    }
    Ok(())
}
