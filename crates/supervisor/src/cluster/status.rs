//! `mini-letta cluster status`: the hosts etcd knows (alive or not, how
//! many agents each owns) and each agent's owner, read straight from etcd.
//! Values come from etcd and are not trusted: they are shown through the
//! output layer and only parsed, never acted on.

use std::collections::BTreeMap;

use etcd_client::{Client, ConnectOptions, GetOptions};
use serde::Serialize;

use super::config::ClusterConfig;
use super::error::ClusterError;
use super::keys::{PREFIX, agent_from_etcd, host_from_etcd};

/// One host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostRow {
    /// Its id, or a brief visible form of a key that names no host id.
    pub id: String,
    /// Whether `id` is a host id (false: planted or corrupt data).
    pub valid: bool,
    /// Its supervisor renewed its lease lately (within two renewals): it
    /// runs. A killed or stopped one is not alive at once, though its
    /// lease (and what it owns) lasts until the lease expires.
    pub alive: bool,
    /// Its lease is alive (its host key is there).
    pub lease: bool,
    /// How long ago it last renewed its lease, by its clock and this one.
    pub renewed_ms_ago: Option<u64>,
    /// Agents it owns now.
    pub agents: usize,
}

/// One owned agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentRow {
    /// The agent's id, or a brief visible form of a key that names none.
    pub id: String,
    /// Whether `id` is an agent id (false: a planted or corrupt key, which
    /// is listed but counted for no host).
    pub valid: bool,
    /// The owner's host id, or a brief visible form of a value that is
    /// none ([`host_from_etcd`]).
    pub owner: String,
    /// Whether `owner` is a host id.
    pub owner_valid: bool,
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

fn row(id: String, valid: bool) -> HostRow {
    HostRow {
        id,
        valid,
        alive: false,
        lease: false,
        renewed_ms_ago: None,
        agents: 0,
    }
}

/// From a host key's value (untrusted: parsed, never acted on): how long
/// ago its lease was renewed, and whether that is recent enough to call it
/// alive — within two renewals (a renewal every third of the lease) and
/// half a second. A value without the time (an older supervisor's) says
/// only that the lease lives.
fn liveness(value: &[u8]) -> (bool, Option<u64>) {
    let v: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
    let (Some(renewed), Some(lease_secs)) = (v["renewed_at_ms"].as_u64(), v["lease_secs"].as_u64())
    else {
        return (true, None);
    };
    let now = super::events::wall_ms(std::time::Instant::now()) as u64;
    let ago = now.saturating_sub(renewed);
    let window = lease_secs.saturating_mul(2000) / 3 + 500;
    (ago <= window, Some(ago))
}

/// Keys a page of [`read_all`] asks for at first.
const PAGE_KEYS: i64 = 256;

/// Tries of one page before the read fails: a request the client handed to
/// a member that is down fails at once, and the next goes to another.
const PAGE_TRIES: u32 = 12;

/// Every key under [`PREFIX`], in pages read at one revision (one
/// consistent view). A page too large to receive — planted values past
/// gRPC's 4 MiB — is asked again at half the keys, down to one (a single
/// value is within etcd's request limit); a failed page is asked again, so
/// any live member answers (issue 43, LOW: one member down failed 4 reads
/// of 10, 4 MiB of planted values every read).
async fn read_all(client: &mut Client) -> Result<Vec<etcd_client::KeyValue>, etcd_client::Error> {
    let mut end = PREFIX.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    let mut from = PREFIX.as_bytes().to_vec();
    let limit = std::cell::Cell::new(PAGE_KEYS);
    let mut revision = 0;
    let mut out = Vec::new();
    loop {
        // Each failure halves the page asked for next.
        let page = PAGE_RETRY
            .run_async(
                |_| {
                    limit.set((limit.get() / 2).max(1));
                    true
                },
                || {
                    let mut options = GetOptions::new()
                        .with_range(end.clone())
                        .with_limit(limit.get());
                    if revision > 0 {
                        options = options.with_revision(revision);
                    }
                    let mut client = client.clone();
                    let from = from.clone();
                    async move { client.get(from, Some(options)).await }
                },
            )
            .await?;
        if revision == 0 {
            revision = page.header().map(|h| h.revision()).unwrap_or(0);
        }
        let kvs = page.kvs();
        let Some(last) = kvs.last() else { break };
        from = last.key().to_vec();
        from.push(0);
        out.extend(kvs.iter().cloned());
        if !page.more() {
            break;
        }
        limit.set((limit.get() * 2).min(PAGE_KEYS));
    }
    Ok(out)
}

/// The pace of a page's tries: 50 ms apart.
const PAGE_RETRY: crate::retry::Policy = crate::retry::Policy::backoff(
    PAGE_TRIES,
    std::time::Duration::from_millis(50),
    std::time::Duration::from_millis(50),
);

/// Read the status with `client`.
pub async fn read(cfg: &ClusterConfig, mut client: Client) -> Result<Status, ClusterError> {
    let fail = |e: etcd_client::Error| ClusterError::Etcd {
        endpoints: cfg.endpoints.join(","),
        what: "did not answer the status".into(),
        message: e.to_string(),
    };
    let all = read_all(&mut client).await.map_err(fail)?;
    let mut members: BTreeMap<String, HostRow> = BTreeMap::new();
    let mut agents = Vec::new();
    let mut alive = Vec::new();
    let either = |r: Result<String, String>| match r {
        Ok(v) => (v, true),
        Err(shown) => (shown, false),
    };
    for kv in &all {
        // Keys and values are parsed, never trusted (`host_from_etcd`).
        let Some(rest) = kv.key().strip_prefix(PREFIX.as_bytes()) else {
            continue;
        };
        if let Some(host) = rest.strip_prefix(b"members/") {
            let (id, valid) = either(host_from_etcd(host));
            members.entry(id.clone()).or_insert_with(|| row(id, valid));
        } else if let Some(host) = rest.strip_prefix(b"hosts/") {
            alive.push((either(host_from_etcd(host)), liveness(kv.value())));
        } else if let Some(agent) = rest
            .strip_prefix(b"agents/")
            .and_then(|r| r.strip_suffix(b"/owner"))
        {
            let (owner, owner_valid) = either(host_from_etcd(kv.value()));
            let (id, valid) = either(agent_from_etcd(agent));
            agents.push(AgentRow {
                id,
                valid,
                owner,
                owner_valid,
                epoch: kv.create_revision(),
            });
        }
    }
    for ((host, valid), (renewing, ago)) in alive {
        let r = members
            .entry(host.clone())
            .or_insert_with(|| row(host, valid));
        r.lease = true;
        r.alive = renewing;
        r.renewed_ms_ago = ago;
    }
    // A value that is no host id names no host to count it for, and a key
    // that is no agent id is no agent a host owns (issue 43, LOW).
    for a in agents.iter().filter(|a| a.owner_valid && a.valid) {
        members
            .entry(a.owner.clone())
            .or_insert_with(|| row(a.owner.clone(), true))
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
    blocking(cfg, "did not answer the status", |client| read(cfg, client))
}

/// Run `request` on a small runtime of its own over a bounded connection
/// (a CLI has none); `what` names it when etcd does not answer in time.
pub fn blocking<'a, T, F>(
    cfg: &'a ClusterConfig,
    what: &str,
    request: impl FnOnce(Client) -> F,
) -> Result<T, ClusterError>
where
    F: std::future::Future<Output = Result<T, ClusterError>> + 'a,
{
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
        match tokio::time::timeout(timeout, request(client)).await {
            Ok(r) => r,
            Err(_) => Err(fail(
                what,
                format!("no answer within {} s (no quorum?)", timeout.as_secs()),
            )),
        }
    })
}
