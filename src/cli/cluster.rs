//! `mini-letta cluster status`: who is in the cluster and who owns what,
//! read straight from etcd (no supervisor needed). Host ids and owners
//! come from etcd and are shown through the output layer.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;

use super::globals::Globals;
use crate::cluster::ClusterConfig;
use crate::cluster::status::{Status, read_blocking};
use crate::console::output;
use crate::store;

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The hosts etcd knows (alive or not, agents owned) and each agent's
    /// owner: this home's agents, and every agent another host owns.
    #[command(
        after_help = "Examples:\n  mini-letta cluster status          # exits 1 outside a cluster (MINI_LETTA_ETCD)\n  mini-letta cluster status --json   # exits 1 outside a cluster (MINI_LETTA_ETCD)"
    )]
    Status {
        /// Print {"host", "etcd", "hosts": [{"id", "valid", "alive", "lease",
        /// "renewed_ms_ago", "agents"}], "agents": [{"id", "valid", "name", "owner",
        /// "owner_valid", "epoch"}]}; a key that is no agent id is listed
        /// with "valid": false and counted for no host.
        #[arg(long)]
        json: bool,
    },
    /// After etcd lost its data (restored from nothing, or a new cluster):
    /// raise its epoch base past every fence in the remote, so hosts can
    /// take agents over again with fencing intact. Reads the fences of
    /// every agent in a directory remote root (of this home's agents, as
    /// last fetched, for a network root); never lowers the base; safe to
    /// run again.
    #[command(
        after_help = "Examples:\n  mini-letta cluster recover          # exits 1 outside a cluster (MINI_LETTA_ETCD)\n  mini-letta cluster recover --json   # exits 1 outside a cluster (MINI_LETTA_ETCD)"
    )]
    Recover {
        /// Print {"base_before", "base", "largest_fence_epoch", "fences":
        /// [{"agent", "host", "epoch", "plausible"}]}.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cli: &Globals, cmd: &ClusterCommand) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let cfg = ClusterConfig::load(&home)?.with_context(|| {
        format!(
            "no cluster is configured: set {} (or [cluster] etcd in {})",
            crate::cluster::config::ETCD_ENV,
            home.config_file().display()
        )
    })?;
    match cmd {
        ClusterCommand::Status { json } => status(&home, &cfg, *json),
        ClusterCommand::Recover { json } => recover(&home, &cfg, *json),
    }
}

fn recover(home: &crate::paths::Home, cfg: &ClusterConfig, json: bool) -> anyhow::Result<ExitCode> {
    let root = crate::remote::root_from_env().with_context(|| {
        format!(
            "the fences are read from the shared remote: set {}",
            crate::memfs::sync::REMOTE_ROOT_ENV
        )
    })?;
    let fences = crate::remote::fences(home, &root)?;
    let largest = crate::remote::largest_fence_epoch(&fences);
    let raised = crate::cluster::recover::raise_base_blocking(cfg, largest.saturating_add(1))?;
    if json {
        output::json(&json!({
            "base_before": raised.before,
            "base": raised.after,
            "largest_fence_epoch": largest,
            "fences": fences,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    for f in fences.iter().filter(|f| !f.plausible) {
        eprintln!(
            "warning: agent {}'s fence (host {}) has epoch {}, which mini-letta never issues: \
             not counted; that fence was planted",
            output::text(&f.agent),
            output::text(&f.host),
            f.epoch
        );
    }
    if raised.after == raised.before {
        println!(
            "the epoch base is {} already, past the largest fence epoch in the remote ({largest}, \
             {} fence(s)): nothing to do",
            raised.before,
            fences.len()
        );
    } else {
        println!(
            "raised the epoch base from {} to {} (the largest fence epoch in the remote is \
             {largest}, {} fence(s)): hosts can take agents over again",
            raised.before,
            raised.after,
            fences.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn status(home: &crate::paths::Home, cfg: &ClusterConfig, json: bool) -> anyhow::Result<ExitCode> {
    let status = read_blocking(cfg)?;
    let local = store::list(home).unwrap_or_default();
    let name_of = |id: &str| local.iter().find(|a| a.id == id).map(|a| a.name.clone());
    // This home's agents first (owned or not), then the others etcd names.
    let mut agents: Vec<serde_json::Value> = local
        .iter()
        .map(|a| agent_row(&status, &a.id, Some(a.name.clone())))
        .collect();
    for a in &status.agents {
        if name_of(&a.id).is_none() {
            agents.push(agent_row(&status, &a.id, None));
        }
    }
    if json {
        output::json(&json!({
            "host": status.host,
            "etcd": status.etcd,
            "hosts": status.hosts,
            "agents": agents,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "this host: {}; etcd: {}",
        output::field(&status.host),
        output::field(&status.etcd.join(","))
    );
    let mut hosts = output::Table::new(&["HOST", "ALIVE", "LEASE", "AGENTS"]).right(3);
    for h in &status.hosts {
        // Not renewing, but its lease (and what it owns) not over yet.
        let lease = match (h.lease, h.renewed_ms_ago) {
            (false, _) => "none".to_string(),
            (true, Some(ms)) if !h.alive => format!("renewed {:.1} s ago", ms as f64 / 1000.0),
            (true, _) => "held".to_string(),
        };
        hosts.row(vec![
            h.id.clone(),
            if h.alive { "yes" } else { "no" }.into(),
            lease,
            h.agents.to_string(),
        ]);
    }
    hosts.print()?;
    println!();
    let mut table = output::Table::new(&["AGENT", "NAME", "OWNER"]);
    for a in &agents {
        let cell = |k: &str| a[k].as_str().unwrap_or("-").to_string();
        table.row(vec![cell("id"), cell("name"), cell("owner")]);
    }
    table.print()?;
    let planted = status.agents.iter().filter(|a| !a.valid).count();
    if planted > 0 {
        eprintln!(
            "warning: {planted} owner key(s) in etcd name no agent id (planted or corrupt): \
             listed, counted for no host"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One agent's row: its owner (`null` when none) and epoch.
fn agent_row(status: &Status, id: &str, name: Option<String>) -> serde_json::Value {
    let owned = status.agents.iter().find(|a| a.id == id);
    json!({
        "id": id,
        "valid": owned.is_none_or(|a| a.valid),
        "name": name,
        "owner": owned.map(|a| a.owner.clone()),
        "owner_valid": owned.map(|a| a.owner_valid),
        "epoch": owned.map(|a| a.epoch),
    })
}
