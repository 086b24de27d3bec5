//! `mini-letta cluster status`: the hosts etcd knows (alive or not, how
//! many agents each owns) and each agent's owner, read straight from etcd.
//! Values come from etcd and are not trusted: they are shown through the
//! output layer and only parsed, never acted on.

use std::collections::BTreeMap;

use etcd_client::{Client, ConnectOptions, GetOptions};
use serde::Serialize;

use super::{ClusterConfig, ClusterError, PREFIX};

/// One host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostRow {
    pub id: String,
    /// Its lease is alive.
    pub alive: bool,
    /// Agents it owns now.
    pub agents: usize,
}

/// One owned agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentRow {
    pub id: String,
    pub owner: String,
    /// The ownership's epoch (the owner key's create revision).
    pub epoch: i64,
}

/// The cluster as etcd sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    /// The host this command runs as.
    pub host: String,
    pub etcd: Vec<String>,
    pub hosts: Vec<HostRow>,
    pub agents: Vec<AgentRow>,
}

impl Status {
    /// The owner of `agent`, if it has one.
    pub fn owner_of(&self, agent: &str) -> Option<&str> {
        self.agents
            .iter()
            .find(|a| a.id == agent)
            .map(|a| a.owner.as_str())
    }
}

/// Read the status with `client`.
pub async fn read(cfg: &ClusterConfig, mut client: Client) -> Result<Status, ClusterError> {
    let fail = |e: etcd_client::Error| ClusterError::Etcd {
        endpoints: cfg.endpoints.join(","),
        what: "did not answer the status".into(),
        message: e.to_string(),
    };
    let all = client
        .get(PREFIX, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(fail)?;
    let mut members: BTreeMap<String, HostRow> = BTreeMap::new();
    let mut agents = Vec::new();
    let row = |id: &str| HostRow {
        id: id.to_string(),
        alive: false,
        agents: 0,
    };
    let mut alive = Vec::new();
    for kv in all.kvs() {
        let key = String::from_utf8_lossy(kv.key());
        let Some(rest) = key.strip_prefix(PREFIX) else {
            continue;
        };
        let value = String::from_utf8_lossy(kv.value()).into_owned();
        if let Some(host) = rest.strip_prefix("members/") {
            members.entry(host.to_string()).or_insert_with(|| row(host));
        } else if let Some(host) = rest.strip_prefix("hosts/") {
            alive.push(host.to_string());
        } else if let Some(agent) = rest
            .strip_prefix("agents/")
            .and_then(|r| r.strip_suffix("/owner"))
        {
            agents.push(AgentRow {
                id: agent.to_string(),
                owner: value,
                epoch: kv.create_revision(),
            });
        }
    }
    for host in alive {
        members
            .entry(host.clone())
            .or_insert_with(|| row(&host))
            .alive = true;
    }
    for a in &agents {
        members
            .entry(a.owner.clone())
            .or_insert_with(|| row(&a.owner))
            .agents += 1;
    }
    Ok(Status {
        host: cfg.host_id.clone(),
        etcd: cfg.endpoints.clone(),
        hosts: members.into_values().collect(),
        agents,
    })
}

/// [`read`] from a process without a runtime (the CLI, Palace's threads):
/// a small one of its own, and a bounded connection.
pub fn read_blocking(cfg: &ClusterConfig) -> Result<Status, ClusterError> {
    let fail = |what: &str, e: String| ClusterError::Etcd {
        endpoints: cfg.endpoints.join(","),
        what: what.into(),
        message: e,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail("cannot be asked", e.to_string()))?;
    let timeout = std::time::Duration::from_secs(3);
    rt.block_on(async {
        let options = ConnectOptions::new()
            .with_timeout(timeout)
            .with_connect_timeout(timeout)
            .with_require_leader(true);
        let client = Client::connect(&cfg.endpoints, Some(options))
            .await
            .map_err(|e| fail("cannot be reached", e.to_string()))?;
        match tokio::time::timeout(timeout, read(cfg, client)).await {
            Ok(r) => r,
            Err(_) => Err(fail(
                "did not answer the status",
                format!("no answer within {} s (no quorum?)", timeout.as_secs()),
            )),
        }
    })
}
