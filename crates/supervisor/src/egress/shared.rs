//! What the egress proxy's tasks share: the supervisor's egress state
//! ([`Egress`]), the child a connection belongs to, an agent's policy as
//! read for a connection, the connection slots, and the reads and name
//! resolution every session uses. The per-child loop is in
//! [`super::serve`], a session in [`super::proxy`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::allow::AllowList;
use super::config::NetworkConfig;
use super::log::{LogWriter, NetRecord};
use super::netns::NetnsWorker;
use crate::paths::Home;

/// Connections through the proxy at once, all agents together.
pub const MAX_TOTAL: usize = 1024;
/// Policy reads at once, all agents together (name resolution has its
/// own shares: [`super::resolver`]).
pub const READERS: usize = 8;
/// The longest wait for a policy read's permit.
const READ_WAIT: Duration = Duration::from_secs(2);
/// A policy read is reused for this long (a flood of connections costs
/// one read of the files per agent per interval).
const POLICY_TTL: Duration = Duration::from_secs(1);
/// A child as the supervisor's table knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRef {
    pub id: u64,
    pub agent: String,
    pub role: String,
}

/// An agent's list and the `[network]` settings, as read for a connection.
#[derive(Debug)]
pub struct Policy {
    pub config: NetworkConfig,
    /// Why `config.toml` could not be used (then everything is refused).
    pub config_error: Option<String>,
    pub list: Result<AllowList, String>,
}

/// What every proxy task shares.
pub struct Egress {
    pub(super) home: Home,
    pub(super) log: Option<LogWriter>,
    pub(super) netns: NetnsWorker,
    pub(super) readers: Arc<Semaphore>,
    pub(super) resolver: super::resolver::Resolver,
    pub(super) total: Arc<Semaphore>,
    pub(super) active: Mutex<HashMap<String, usize>>,
    pub(super) policies: Mutex<HashMap<String, (Instant, Arc<Policy>)>>,
    pub(super) children: Mutex<HashMap<u64, CancellationToken>>,
    /// Which refusals become audit records one by one.
    pub(super) denials: Arc<super::denials::Denials>,
    /// Which finished connections do.
    pub(super) transfers: Arc<super::denials::Denials>,
    /// New connections per agent per second.
    pub(super) pace: super::pace::Pace,
    /// Counts waiting for a record of their own, by kind and agent: the
    /// role and child that record names.
    pub(super) counted: Arc<Mutex<Counted>>,
}

/// Counts waiting for their record: (kind, agent) → (role, child).
pub(super) type Counted = HashMap<(&'static str, String), (String, u64)>;

/// A held connection slot: one of the agent's and one of all.
pub struct Slot {
    pub(super) egress: Arc<Egress>,
    pub(super) agent: String,
    pub(super) _total: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut active = lock(&self.egress.active);
        if let Some(n) = active.get_mut(&self.agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                active.remove(&self.agent);
            }
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Egress {
    /// The state of `home`'s supervisor. Without its log writer nothing
    /// goes through (an attempt that cannot be recorded is not made).
    pub fn new(home: Home) -> Self {
        let log = match LogWriter::start(home.clone()) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::error!(
                    "egress: cannot start the network log writer ({e}); every connection will be refused"
                );
                None
            }
        };
        Self {
            home,
            log,
            netns: NetnsWorker::default(),
            readers: Arc::new(Semaphore::new(READERS)),
            resolver: Default::default(),
            total: Arc::new(Semaphore::new(MAX_TOTAL)),
            active: Mutex::new(HashMap::new()),
            policies: Mutex::new(HashMap::new()),
            children: Mutex::new(HashMap::new()),
            denials: Arc::default(),
            transfers: Arc::default(),
            counted: Arc::default(),
            pace: Default::default(),
        }
    }

    /// A refused attempt as a `denied` record of the audit log (every
    /// field the supervisor's own: the child table's agent, role and id,
    /// the host as written), appended and synced off the async workers —
    /// up to a per-agent rate ([`super::denials`]); past it the refusals
    /// are counted, and the count is carried by the agent's next recorded
    /// refusal (`suppressed_before`) or, at the latest
    /// [`super::denials::FLUSH_AFTER`] later, by a record of its own
    /// (`suppressed`). Logged, not fatal, when it cannot be: the refusal
    /// stands either way.
    pub(crate) async fn audit_denied(&self, r: &NetRecord) {
        let mut fields = serde_json::Map::new();
        fields.insert("request".into(), r.method.clone().into());
        fields.insert("host".into(), r.host.clone().into());
        fields.insert("port".into(), r.port.into());
        fields.insert("reason".into(), r.reason.clone().into());
        self.audit_rated(&self.denials, crate::audit::kind::DENIED, r, 0, fields)
            .await;
    }

    /// A finished allowed connection as an `egress` record of the audit
    /// log, with the bytes it carried (`egress_bytes`, what `usage` sums):
    /// the network log rotates, and a tenant can make it rotate; the audit
    /// log keeps every transfer. At the same per-agent rate as refusals,
    /// past which connections and their bytes are carried by the next
    /// record (`suppressed_before`, bytes included in `egress_bytes`).
    pub(crate) async fn audit_transfer(&self, r: &NetRecord) {
        let mut fields = serde_json::Map::new();
        fields.insert("request".into(), r.method.clone().into());
        fields.insert("host".into(), r.host.clone().into());
        fields.insert("port".into(), r.port.into());
        fields.insert("address".into(), serde_json::json!(r.address));
        fields.insert("bytes_up".into(), r.bytes_up.into());
        fields.insert("bytes_down".into(), r.bytes_down.into());
        fields.insert("duration_ms".into(), r.duration_ms.into());
        let bytes = r.bytes_up.saturating_add(r.bytes_down);
        self.audit_rated(
            &self.transfers,
            crate::audit::kind::EGRESS,
            r,
            bytes,
            fields,
        )
        .await;
    }

    /// One record of `kind` for event `r` (which carried `bytes`), or its
    /// count kept for a later one ([`super::denials`]).
    async fn audit_rated(
        &self,
        rate: &Arc<super::denials::Denials>,
        kind: &'static str,
        r: &NetRecord,
        bytes: u64,
        mut fields: serde_json::Map<String, serde_json::Value>,
    ) {
        use super::denials::{Admit, FLUSH_AFTER};
        fields.insert("child".into(), r.child.into());
        fields.insert("method".into(), "egress".into());
        match rate.admit(&r.agent, Instant::now(), bytes) {
            Admit::Record { before } => {
                if before.events > 0 {
                    fields.insert("suppressed_before".into(), before.events.into());
                }
                if kind == crate::audit::kind::EGRESS {
                    fields.insert(
                        "egress_bytes".into(),
                        bytes.saturating_add(before.bytes).into(),
                    );
                }
            }
            Admit::Count { schedule_flush } => {
                if schedule_flush {
                    lock(&self.counted).insert((kind, r.agent.clone()), (r.role.clone(), r.child));
                    let (home, rate) = (self.home.clone(), rate.clone());
                    let (agent, counted) = (r.agent.clone(), self.counted.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(FLUSH_AFTER).await;
                        let who = lock(&counted).remove(&(kind, agent.clone()));
                        if let Some((role, child)) = who {
                            write_counted(home, &rate, kind, agent, role, child).await;
                        }
                    });
                }
                return;
            }
        }
        append_rated(
            self.home.clone(),
            kind,
            r.agent.clone(),
            r.role.clone(),
            fields,
        )
        .await;
    }

    /// Write every count still waiting for its record (at the
    /// supervisor's stop: what was counted is not lost with the process).
    pub(crate) async fn flush_counted(&self) {
        let waiting: Vec<_> = lock(&self.counted).drain().collect();
        for ((kind, agent), (role, child)) in waiting {
            let rate = match kind {
                crate::audit::kind::EGRESS => &self.transfers,
                _ => &self.denials,
            };
            write_counted(self.home.clone(), rate, kind, agent, role, child).await;
        }
    }

    /// Record an attempt (the writer waits when its queue is full).
    pub async fn record(&self, record: NetRecord) {
        match &self.log {
            Some(log) => log.record(record).await,
            None => {
                tracing::warn!(agent = %record.agent, "egress: attempt not recorded: no network log")
            }
        }
    }

    /// The agent's list and the settings, read at most every
    /// [`POLICY_TTL`] (off the async workers, [`READERS`] at once, the
    /// wait for one bounded: a read that cannot start in time refuses
    /// this connection and is not remembered).
    pub(super) async fn policy(&self, agent: &str) -> Arc<Policy> {
        if let Some((at, p)) = lock(&self.policies).get(agent)
            && at.elapsed() < POLICY_TTL
        {
            return p.clone();
        }
        let Ok(Ok(permit)) =
            tokio::time::timeout(READ_WAIT, self.readers.clone().acquire_owned()).await
        else {
            return Arc::new(unreadable("the policy reader is busy"));
        };
        let (home, id) = (self.home.clone(), agent.to_string());
        let read = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            load(&home, &id)
        });
        let policy = Arc::new(
            read.await
                .unwrap_or_else(|_| unreadable("the policy could not be read")),
        );
        let mut cache = lock(&self.policies);
        // Bounded by the agents with children: stale entries go.
        cache.retain(|_, (at, _)| at.elapsed() < POLICY_TTL * 60);
        cache.insert(agent.to_string(), (Instant::now(), policy.clone()));
        policy
    }

    /// Resolve `name` for `agent` within its share ([`super::resolver`]).
    pub async fn resolve(
        &self,
        agent: &str,
        name: &str,
        port: u16,
    ) -> Result<Vec<std::net::IpAddr>, super::resolver::ResolveError> {
        self.resolver.resolve(agent, name, port).await
    }
}

/// A policy that refuses everything, saying `why`.
fn unreadable(why: &str) -> Policy {
    Policy {
        config: NetworkConfig::default(),
        config_error: Some(why.into()),
        list: Ok(AllowList::default()),
    }
}

/// Read the settings and agent `id`'s list.
fn load(home: &Home, id: &str) -> Policy {
    let (config, config_error) = match NetworkConfig::load(home) {
        Ok(c) => (c, None),
        Err(e) => (NetworkConfig::default(), Some(e.to_string())),
    };
    Policy {
        config,
        config_error,
        list: super::policy::read(home, id).map_err(|e| e.to_string()),
    }
}

/// The record of `agent`'s events of `kind` counted past the rate, if any
/// are still waiting.
async fn write_counted(
    home: Home,
    rate: &super::denials::Denials,
    kind: &'static str,
    agent: String,
    role: String,
    child: u64,
) {
    let n = rate.take(&agent);
    if n.events == 0 {
        return;
    }
    let mut fields = serde_json::Map::new();
    fields.insert("child".into(), child.into());
    fields.insert("method".into(), "egress".into());
    fields.insert("suppressed".into(), n.events.into());
    if kind == crate::audit::kind::EGRESS {
        fields.insert("egress_bytes".into(), n.bytes.into());
    }
    fields.insert(
        "reason".into(),
        format!(
            "{} events over the rate recorded one by one ({} a second)",
            n.events,
            super::denials::RATE_PER_SEC
        )
        .into(),
    );
    append_rated(home, kind, agent, role, fields).await;
}

/// Append one record off the async workers; logged when it cannot be.
async fn append_rated(
    home: Home,
    kind: &'static str,
    agent: String,
    role: String,
    fields: serde_json::Map<String, serde_json::Value>,
) {
    let who = agent.clone();
    let appended = tokio::task::spawn_blocking(move || {
        crate::audit::append(&home, kind, Some(&agent), Some(&role), fields)
    })
    .await;
    match appended {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::error!(agent = %who, "egress: cannot audit an attempt ({kind}): {e}")
        }
        Err(e) => tracing::error!(agent = %who, "egress: cannot audit an attempt ({kind}): {e}"),
    }
}
