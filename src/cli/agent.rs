//! `mini-letta agent …`

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;

use super::agent_make::{CreateArgs, make, model_handle};
use super::globals::Globals;
use crate::console::output::{self, field as f};
use crate::paths::Home;
use crate::store::record::ModelSource;
use crate::store::{self, archive};

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Create an agent with a fresh memory repository (memfs-v2 layout).
    #[command(after_help = "Examples:\n  mini-letta agent create alice\n  \
                            mini-letta agent create bob --model openai/gpt-4o-mini\n  \
                            mini-letta agent create tiny --context-window 900")]
    Create {
        /// A unique, human-readable name.
        name: String,
        /// The model its turns use: `mock`, `mock/scripted`,
        /// `openai/<model>` or `anthropic/<model>` (default: `[model]
        /// default` of config.toml, else `mock`).
        #[arg(long, value_name = "M")]
        model: Option<String>,
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
        /// Context window of its turns in tokens, recorded as
        /// `model_settings.context_window_limit` (default: the window
        /// config.toml gives its model). Conversations are compacted above
        /// window − min(16384, window / 5).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        context_window: Option<u64>,
        /// Print the new agent's record as JSON ({"id", "name", "model",
        /// "created_at", "system", …}).
        #[arg(long)]
        json: bool,
    },
    /// Give an agent a new name (names are unique; the id stays).
    #[command(
        after_help = "Examples:\n  mini-letta agent rename alice bob\n  mini-letta agent rename alice bob --json"
    )]
    Rename {
        /// Agent id or current name.
        agent: String,
        /// The new name.
        new_name: String,
        /// Print the updated record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set the agent's token budget: a turn that would start with it spent
    /// is refused before any model call; a turn crossing it stops after
    /// the model call under way. Its sub-agents count against it.
    #[command(
        after_help = "Examples:\n  mini-letta agent set-budget owl --tokens 200000 --period day\n  \
                            mini-letta agent set-budget owl --clear"
    )]
    SetBudget {
        /// Agent id or name.
        agent: String,
        /// Input plus output tokens allowed per period.
        #[arg(long, value_name = "N", required_unless_present = "clear")]
        tokens: Option<u64>,
        /// day (UTC), month (UTC) or total.
        #[arg(long, value_name = "P", default_value = "day")]
        period: crate::audit::budget::Period,
        /// Remove the budget.
        #[arg(long, conflicts_with = "tokens")]
        clear: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change the model an agent's turns use (from its next turn on).
    #[command(
        after_help = "Examples:\n  mini-letta agent set-model alice anthropic/claude-sonnet-4-5\n  \
                            mini-letta agent set-model alice mock"
    )]
    SetModel {
        /// Agent id or name.
        agent: String,
        /// `mock`, `mock/scripted`, `openai/<model>` or `anthropic/<model>`.
        model: String,
        /// Print the updated record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set what an agent's commands may reach through the supervisor's
    /// egress proxy (replacing its list): HOST is a name (`pypi.org`), a
    /// wildcard (`*.github.com`: any subdomain, not the apex) or a literal
    /// IP (`127.0.0.1`, `[::1]`); without `:PORT`, ports 80 and 443. A
    /// request is judged by the host as it writes it: `127.0.0.1:8080` is
    /// not `localhost:8080`. `--none` (the default) allows nothing.
    #[command(after_help = "Examples:
  mini-letta agent set-network alice --allow pypi.org --allow files.pythonhosted.org
  mini-letta agent set-network alice --allow '*.github.com' --allow localhost:8080
  mini-letta agent set-network alice --none")]
    SetNetwork {
        /// Agent id or name.
        agent: String,
        /// A host the agent's commands may reach: HOST[:PORT]
        /// (repeatable).
        #[arg(long, value_name = "HOST[:PORT]", conflicts_with = "none")]
        allow: Vec<String>,
        /// Allow nothing: no network at all (the default).
        #[arg(long)]
        none: bool,
        /// Print {"agent", "name", "network": {"allow": [...]}}.
        #[arg(long)]
        json: bool,
    },
    /// Show every attempt an agent's commands made through the egress
    /// proxy: time, role, child, method, host and port as written, the
    /// verdict, bytes each way, duration and the reason of a refusal.
    #[command(after_help = "Examples:
  mini-letta agent network-log alice
  mini-letta agent network-log alice --since 2026-05-01 --json")]
    NetworkLog {
        /// Agent id or name (default: the only agent).
        agent: Option<String>,
        /// Agent id or name (same as the positional argument; default: the
        /// only agent).
        #[arg(
            short = 'a',
            long = "agent",
            value_name = "AGENT",
            conflicts_with = "agent"
        )]
        agent_flag: Option<String>,
        /// Only attempts at or after T (YYYY-MM-DD or an RFC 3339 time).
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// Print {"agent", "records": [{"time", "agent", "role", "child",
        /// "method", "host", "port", "address", "verdict" ("allowed" or
        /// "denied"), "reason", "bytes_up", "bytes_down", "duration_ms"}]}.
        #[arg(long)]
        json: bool,
    },
    /// Delete an agent for good: its memory, conversations and files, its
    /// quota volume, and its sandbox uid (the only way a uid is freed).
    /// Refused while any of its children run.
    #[command(after_help = "Examples:\n  mini-letta agent delete alice --yes\n\n\
                            Without --yes, a terminal asks you to type the agent's name; \
                            anything else refuses.")]
    Delete {
        /// Agent id or name.
        agent: String,
        /// Yes, delete it (nothing of it can be recovered). Without it, a
        /// terminal asks you to type the agent's name; otherwise refused.
        #[arg(long)]
        yes: bool,
        /// Print {"deleted", "name", "uid_freed", "volume_removed"}.
        #[arg(long)]
        json: bool,
    },
    /// In a cluster: give back an agent this host owns, so another host may
    /// take it at once (a clean `supervisor stop` gives back all of them).
    #[command(
        after_help = "Examples:\n  mini-letta agent release alice   # exits 1 outside a cluster (MINI_LETTA_ETCD)"
    )]
    Release {
        /// Agent id or name.
        agent: String,
        /// Print {"agent", "name", "released", "host"}.
        #[arg(long)]
        json: bool,
    },
    /// Write an agent to a .tar.gz archive (to move or back it up).
    ///
    /// The archive holds its record (without its sandbox uid), memory
    /// working tree, memory history (memory.git) and conversations. Runtime leftovers (tmp/, memory-worktrees/, lock
    /// files) stay behind; symbolic links, FIFOs, sockets, devices and
    /// hard-linked files inside the agent's directory are skipped with a
    /// warning on stderr, never archived.
    #[command(after_help = "Examples:\n  mini-letta agent export alice\n  \
                            mini-letta agent export alice -o ~/alice-backup.tar.gz")]
    Export {
        /// Agent id or name.
        agent: String,
        /// Where to write the archive (default: ./<name>.mini-letta.tar.gz);
        /// written to a temporary file and renamed over it when complete.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
        /// Print {"path", "id", "name", "entries", "bytes" (of the files),
        /// "archive_bytes" (the archive on disk), "skipped"}.
        #[arg(long)]
        json: bool,
    },
    /// Add an agent from an archive written by `agent export`.
    ///
    /// The whole archive is checked first (only regular files and directories under
    /// plain relative paths, bounded size and entry count, a valid record,
    /// a memory repository whose HEAD passes the validator); nothing lands
    /// in the home unless all of it passes. The agent keeps its id: an
    /// agent with the same id or name already here is refused.
    #[command(
        after_help = "Examples:\n  mini-letta agent import alice.mini-letta.tar.gz\n  \
                            mini-letta agent import alice.mini-letta.tar.gz --name alice2"
    )]
    Import {
        /// The archive (.tar.gz).
        file: PathBuf,
        /// The name the imported agent gets (default: its archived name).
        #[arg(long, value_name = "NEW_NAME")]
        name: Option<String>,
        /// Print the imported agent's record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List agents, oldest first.
    ///
    /// Agents whose record cannot be read are listed last, with the reason.
    #[command(after_help = "Examples:
  mini-letta agent list
  mini-letta agent list --json
  mini-letta agent list --remote --json")]
    List {
        /// Print {"agents": [...]} instead of a table (an unreadable agent
        /// is an entry with `id`, `name` and `error`).
        #[arg(long)]
        json: bool,
        /// List the agents on the remote ($MINI_LETTA_REMOTE_ROOT, a
        /// directory of bare repositories) instead, and whether each is on
        /// this host; `chat -a NAME` clones one that is not. With --json:
        /// {"remote", "agents": [{"id", "name", "model", "created_at",
        /// "local"}]}.
        #[arg(long)]
        remote: bool,
    },
    /// Show one agent's record and where its files are, and the context
    /// figures of its default conversation.
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
        /// Print the record (and its directories, and the default
        /// conversation's context figures as "context") as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `agent create`: everything another host or an import would refuse is
/// refused before anything is made.
fn create(home: &Home, asked: &CreateArgs, json: bool) -> anyhow::Result<()> {
    let record = make(home, asked)?;
    if json {
        output::json(&record)?;
    } else {
        println!(
            "created agent {} ({}), model {}",
            f(&record.name),
            f(&record.id),
            f(&record.model)
        );
    }
    Ok(())
}

pub fn run(cli: &Globals, cmd: &AgentCommand) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    match cmd {
        AgentCommand::Create {
            name,
            model,
            system_file,
            disk_mb,
            inodes,
            context_window,
            json,
        } => {
            let asked = CreateArgs {
                name,
                model: model.as_deref(),
                system_file: system_file.as_deref(),
                disk_mb: *disk_mb,
                inodes: *inodes,
                context_window: *context_window,
            };
            create(&home, &asked, *json)?
        }
        AgentCommand::Rename {
            agent,
            new_name,
            json,
        } => rename(&home, agent, new_name, *json)?,
        AgentCommand::SetBudget {
            agent,
            tokens,
            period,
            clear,
            json,
        } => {
            return super::audit::set_budget(&home, agent, *tokens, *period, *clear, *json);
        }
        AgentCommand::SetModel { agent, model, json } => set_model(&home, agent, model, *json)?,
        AgentCommand::SetNetwork {
            agent,
            allow,
            none,
            json,
        } => super::network::set(&home, agent, allow, *none, *json)?,
        AgentCommand::NetworkLog {
            agent,
            agent_flag,
            since,
            json,
        } => super::network::log(
            &home,
            agent.as_deref().or(agent_flag.as_deref()),
            since.as_deref(),
            *json,
        )?,
        AgentCommand::Delete { agent, yes, json } => delete(&home, agent, *yes, *json)?,
        AgentCommand::Release { agent, json } => release(&home, agent, *json)?,
        AgentCommand::Export {
            agent,
            output: out,
            json,
        } => export(&home, agent, out.as_deref(), *json)?,
        AgentCommand::Import { file, name, json } => import(&home, file, name.as_deref(), *json)?,
        AgentCommand::List { json, remote } => {
            if *remote {
                list_remote(&home, *json)?
            } else {
                list(&home, *json)?
            }
        }
        AgentCommand::Show {
            agent,
            agent_flag,
            json,
        } => show(&home, agent.as_deref().or(agent_flag.as_deref()), *json)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `agent release`: in a cluster, give back an agent this host owns.
fn release(home: &Home, agent: &str, json: bool) -> anyhow::Result<()> {
    let v: crate::protocol::replies::AgentReleased = crate::supervisor::Session::call_once(
        home,
        crate::protocol::Call::AgentRelease {
            agent: Some(agent.to_string()),
        },
    )?;
    if json {
        output::json(&v)?;
    } else {
        println!(
            "released agent {} ({}): host {} owns it no more",
            f(&v.name),
            f(&v.agent),
            f(&v.host)
        );
    }
    Ok(())
}

/// `agent rename`.
fn rename(home: &Home, agent: &str, new_name: &str, json: bool) -> anyhow::Result<()> {
    let (old, record) = store::rename(home, agent, new_name)?;
    if json {
        output::json(&record)?;
    } else if old == record.name {
        println!(
            "agent {} ({}) already has that name",
            f(&record.name),
            f(&record.id)
        );
    } else {
        println!(
            "renamed agent {} to {} ({})",
            f(&old),
            f(&record.name),
            f(&record.id)
        );
    }
    Ok(())
}

/// `agent set-model`: the change is a `config` record of the audit log.
fn set_model(home: &Home, agent: &str, model: &str, json: bool) -> anyhow::Result<()> {
    let model = model_handle(model)?;
    let (old, record) = store::set_model(home, agent, &model)?;
    super::audit::record_config(home, &record.id, "model", json!(record.model))?;
    if json {
        output::json(&record)?;
    } else {
        println!(
            "agent {} ({}): model {} -> {}",
            f(&record.name),
            f(&record.id),
            f(&old),
            f(&record.model)
        );
    }
    Ok(())
}

/// `agent export`, to the file given or a default name in the current
/// directory.
fn export(home: &Home, agent: &str, out: Option<&Path>, json: bool) -> anyhow::Result<()> {
    let out = match out {
        Some(p) => p.to_path_buf(),
        None => {
            let (record, _) = store::find(home, Some(agent))?;
            PathBuf::from(default_export_name(&record.name))
        }
    };
    let done = archive::export(home, agent, &out)?;
    for s in &done.skipped {
        crate::console::style::eprint_warning(&format!("skipped {s}"));
    }
    if json {
        output::json(&done)?;
    } else {
        println!(
            "exported agent {} ({}) to {}: {} bytes on disk ({} entries, {} bytes of files)",
            f(&done.name),
            f(&done.id),
            f(&done.path.display().to_string()),
            done.archive_bytes,
            done.entries,
            done.bytes
        );
    }
    Ok(())
}

/// `agent import`: the archive's model must be one this program knows,
/// and the network list is this host's default, never the archive's.
fn import(home: &Home, file: &Path, name: Option<&str>, json: bool) -> anyhow::Result<()> {
    let check = |m: &str| {
        crate::model::factory::parse_handle(m)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let opts = archive::ImportOptions {
        name: name.map(str::to_string),
        check_model: Some(&check),
        ..Default::default()
    };
    let network = crate::egress::config::NetworkConfig::load(home)
        .context("nothing was imported: config.toml")?;
    let record = archive::import(home, file, &opts)
        .with_context(|| format!("cannot import {}", file.display()))?;
    crate::egress::policy::apply_default(home, &record.id, &network)?;
    if json {
        output::json(&record)?;
    } else {
        println!("imported agent {} ({})", f(&record.name), f(&record.id));
    }
    Ok(())
}

/// `agent show`: the record, its directories and the default
/// conversation's context figures.
fn show(home: &crate::paths::Home, selector: Option<&str>, json: bool) -> anyhow::Result<()> {
    let (record, paths) = store::find(home, selector)?;
    let memory_dir = paths.memory_dir();
    let context =
        crate::reports::context_report(home, &record, &paths, super::prompt::DEFAULT_CONVERSATION)
            .map_err(anyhow::Error::from);
    if json {
        let mut value = serde_json::to_value(&record)?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert("dir".into(), json!(paths.dir()));
            obj.insert("memory_dir".into(), json!(memory_dir));
            obj.insert("network".into(), super::network::shown(home, &record.id));
            obj.insert(
                "context".into(),
                match &context {
                    Ok(r) => serde_json::to_value(r)?,
                    Err(e) => json!({ "error": crate::console::one_line(e) }),
                },
            );
        }
        output::json(&value)?;
    } else {
        println!("id:         {}", f(&record.id));
        println!("name:       {}", f(&record.name));
        println!(
            "model:      {} ({})",
            f(&record.model),
            record
                .model_source
                .map_or("recorded at creation", ModelSource::describe)
        );
        println!(
            "created:    {}",
            f(&output::display_stored_time(&record.created_at))
        );
        println!("directory:  {}", f(&paths.dir().display().to_string()));
        println!("memory:     {}", f(&memory_dir.display().to_string()));
        println!(
            "network:    {}",
            super::network::show_line(home, &record.id)
        );
        match &context {
            Ok(r) => {
                println!("window:     {}", super::context::window_text(r));
                let threshold = match r.window.threshold {
                    Some(t) if r.over_threshold => {
                        format!(
                            ", over the {t} threshold (the next turn compacts what it can first)"
                        )
                    }
                    Some(t) => format!(" of {t} before compaction"),
                    None => String::new(),
                };
                println!(
                    "context:    {} tokens{threshold}; {} of {} messages in context (default conversation)",
                    r.tokens, r.messages_in_context, r.messages_stored
                );
                println!("compacted:  {}", super::context::last_compaction_text(r));
            }
            Err(e) => println!(
                "context:    unavailable ({})",
                output::text(&crate::console::one_line(e))
            ),
        }
        println!("system prompt ({} bytes):", record.system.len());
        for line in record.system.lines() {
            println!("  {}", output::text(line));
        }
    }
    Ok(())
}

/// `<name>.mini-letta.tar.gz`, the name made safe as one file name.
fn default_export_name(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| if c == '/' || c == '\\' { '_' } else { c })
        .collect();
    let safe = safe.trim_start_matches('.');
    let safe = if safe.is_empty() { "agent" } else { safe };
    format!("{safe}.mini-letta.tar.gz")
}

fn list(home: &crate::paths::Home, json: bool) -> anyhow::Result<()> {
    let listing = store::list_all(home)?;
    if json {
        let mut agents: Vec<serde_json::Value> = listing
            .agents
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
        for u in &listing.unreadable {
            agents.push(serde_json::to_value(u)?);
        }
        return output::json(&json!({ "agents": agents }));
    }
    if listing.agents.is_empty() && listing.unreadable.is_empty() {
        println!("no agents (create one with `mini-letta agent create NAME`)");
        return Ok(());
    }
    let mut rows: Vec<Vec<String>> = listing
        .agents
        .iter()
        .map(|a| {
            vec![
                a.id.clone(),
                a.name.clone(),
                a.model.clone(),
                output::display_stored_time(&a.created_at),
            ]
        })
        .collect();
    for u in &listing.unreadable {
        rows.push(vec![
            u.id.clone(),
            u.name.clone().unwrap_or_else(|| "-".into()),
            format!("unreadable: {}", u.reason),
        ]);
    }
    let mut table = output::Table::new(&["ID", "NAME", "MODEL", "CREATED"]);
    for row in rows {
        table.row(row);
    }
    table.print()?;
    Ok(())
}

/// `agent list --remote`: the agents on the remote and which are here.
fn list_remote(home: &crate::paths::Home, json: bool) -> anyhow::Result<()> {
    let root = crate::remote::root_from_env().ok_or(crate::remote::RemoteError::NoRemote)?;
    let remote = crate::remote::list(home, &root)?;
    let local = store::list_all(home)?;
    let here = |id: &str| local.has_id(id);
    if json {
        let agents: Vec<serde_json::Value> = remote
            .iter()
            .map(|a| {
                let mut v = serde_json::to_value(a).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("local".into(), json!(here(&a.id)));
                }
                v
            })
            .collect();
        return output::json(&json!({ "remote": root, "agents": agents }));
    }
    if remote.is_empty() {
        println!("no agents on the remote {}", f(&root));
        return Ok(());
    }
    let mut table = output::Table::new(&["ID", "NAME", "MODEL", "CREATED", "HERE"]);
    for a in &remote {
        table.row(vec![
            a.id.clone(),
            a.name.clone().unwrap_or_else(|| "-".into()),
            match &a.error {
                Some(e) => format!("unreadable record: {e}"),
                None => a.model.clone().unwrap_or_default(),
            },
            a.created_at
                .as_deref()
                .map(output::display_stored_time)
                .unwrap_or_default(),
            if here(&a.id) { "yes" } else { "no" }.into(),
        ]);
    }
    table.print()?;
    Ok(())
}

/// Ask on the terminal for the agent's name; whether it was typed.
fn confirm_by_name(name: &str, id: &str) -> anyhow::Result<bool> {
    eprint!(
        "This deletes agent {} ({}): its memory, history, conversations and files, for \
         good.\nType the agent's name to confirm: ",
        output::text(name),
        output::text(id)
    );
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(line.trim_end_matches(['\n', '\r']) == name)
}

fn delete(home: &crate::paths::Home, agent: &str, yes: bool, json: bool) -> anyhow::Result<()> {
    let (record, paths) = store::find(home, Some(agent))?;
    if !yes {
        if !std::io::stdin().is_terminal() {
            anyhow::bail!(
                "deleting agent {} ({}) removes its memory, conversations and files for good; \
                 pass --yes to do it",
                record.name,
                record.id
            );
        }
        if !confirm_by_name(&record.name, &record.id)? {
            anyhow::bail!(
                "not deleted: the name typed was not {:?} (or pass --yes)",
                record.name
            );
        }
    }
    // A running supervisor may have children of this agent.
    if let Ok(mut client) = crate::supervisor::connect(home) {
        use crate::protocol::replies::{ChildState, Children};
        let rows: Children = client.call_as(crate::protocol::Call::Ps {})?;
        let ours = || rows.children.iter().filter(|r| r.agent == record.id);
        // A child started ahead of the agent's next turn holds nothing:
        // it goes first.
        for warm in ours().filter(|r| r.state == ChildState::Warm) {
            let _ = client.call_as::<crate::protocol::replies::Signalled>(
                crate::protocol::Call::Kill {
                    child: warm.id,
                    signal: Some(nix::sys::signal::Signal::SIGKILL as i32),
                },
            );
        }
        let live: Vec<String> = ours()
            .filter(|r| matches!(r.state, ChildState::Running | ChildState::Starting))
            .map(|r| r.id.to_string())
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
    store::remove_agent_files(home, &record.id)
        .with_context(|| format!("cannot remove {}", paths.dir().display()))?;
    // Its allow-list and network log go with it.
    crate::egress::policy::remove(home, &record.id)?;
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
        println!("deleted agent {} ({})", f(&record.name), f(&record.id));
        if let Some(uid) = uid_freed {
            println!("uid {uid} freed");
        }
    }
    Ok(())
}
