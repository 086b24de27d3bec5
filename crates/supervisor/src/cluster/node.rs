//! One clustered supervisor in etcd: its lease (granted, kept alive on the
//! supervisor's runtime, re-granted after a loss), its host registration,
//! and the agents it owns.
//!
//! Fail closed: every etcd request is bounded ([`Node::op_timeout`]) and
//! asks for a leader (a member cut off from the quorum answers at once
//! that it has none); no live lease, no etcd answer — no ownership, and the
//! caller refuses its turn naming etcd. The lease is trusted locally only
//! until the last keep-alive's send time plus its TTL (monotonic time, so
//! a paused process wakes up knowing it may have lost it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use tokio_util::sync::CancellationToken;

use super::config::ClusterConfig;
use super::error::ClusterError;
use super::events::{Change, OwnerChange, Recorder};

mod owners;
use super::keys::{EPOCH_BASE_KEY, host_from_etcd, host_key, member_key, parse_epoch, untrusted};

/// The lease this host holds, and until when it is surely alive.
#[derive(Debug, Clone, Copy)]
struct Lease {
    id: i64,
    valid_until: Instant,
}

/// What [`Node::own`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// This host already owned the agent (in epoch `.0`).
    Already(i64),
    /// This host just took it (epoch `.0`): the caller must take the
    /// remote over before anything else ([`crate::memfs::fence`]).
    Taken(i64),
}

impl Owned {
    pub fn epoch(self) -> i64 {
        match self {
            Owned::Already(e) | Owned::Taken(e) => e,
        }
    }
}

/// The largest plausible fence epoch in the shared remote (a supervisor
/// reads its remote root; issue 43 §3), for an etcd without an epoch base.
pub type FenceScan = Arc<dyn Fn() -> Result<i64, String> + Send + Sync>;

/// A clustered supervisor's membership and ownership.
pub struct Node {
    /// Reads the remote's fences when etcd has no epoch base.
    scan: FenceScan,
    /// Why the last registration was refused (said instead of "no quorum").
    refused: Mutex<Option<String>>,
    /// When this supervisor first tried to register (its host key says so).
    registered_at: String,
    cfg: ClusterConfig,
    /// Where owner changes are recorded (the supervisor's audit log).
    recorder: Recorder,
    client: Client,
    /// One client per member: a try that a member leaves unanswered (or
    /// cannot be sent to it) goes to the next one (issue 43, LOW).
    members: Vec<Client>,
    /// The member that answered last, tried first.
    preferred: std::sync::atomic::AtomicUsize,
    runtime: tokio::runtime::Handle,
    lease: Mutex<Option<Lease>>,
    /// Whether a lease was ever granted (before that, a caller may wait
    /// for the first registration rather than be refused at once).
    registered: std::sync::atomic::AtomicBool,
    /// Agents owned: the epoch each was taken in (the owner key's create
    /// revision, what etcd confirms) and its fence epoch (that plus the
    /// cluster's epoch base, what the remote's fence is stamped with).
    owned: Mutex<HashMap<String, (i64, i64)>>,
    stop: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Node {
    /// Connect (lazily: etcd may be down now) and start keeping a lease on
    /// the current runtime. Registration happens in the background; until
    /// it has, every ownership request fails naming etcd.
    pub async fn start(
        cfg: ClusterConfig,
        recorder: Recorder,
        scan: FenceScan,
    ) -> Result<Arc<Self>, ClusterError> {
        let timeout = op_timeout(cfg.lease_secs);
        let options = ConnectOptions::new()
            .with_timeout(timeout)
            .with_connect_timeout(timeout)
            .with_require_leader(true);
        let client = Client::connect(&cfg.endpoints, Some(options.clone()))
            .await
            .map_err(|e| etcd_error(&cfg, "cannot be reached", e))?;
        let mut members = Vec::new();
        for endpoint in &cfg.endpoints {
            members.push(
                Client::connect([endpoint], Some(options.clone()))
                    .await
                    .map_err(|e| etcd_error(&cfg, "cannot be reached", e))?,
            );
        }
        let node = Arc::new(Self {
            scan,
            refused: Mutex::new(None),
            registered_at: crate::clock::js_iso(crate::clock::now()),
            cfg,
            recorder,
            client,
            members,
            preferred: Default::default(),
            runtime: tokio::runtime::Handle::current(),
            lease: Mutex::new(None),
            registered: Default::default(),
            owned: Mutex::new(HashMap::new()),
            stop: CancellationToken::new(),
        });
        tokio::spawn(node.clone().maintain());
        Ok(node)
    }

    /// Whether this node was ever registered (granted a lease).
    pub(crate) fn has_registered(&self) -> bool {
        self.registered.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn host_id(&self) -> &str {
        &self.cfg.host_id
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    /// How long one etcd request may take.
    pub(crate) fn op_timeout(&self) -> Duration {
        op_timeout(self.cfg.lease_secs)
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> ClusterError {
        etcd_error(&self.cfg, what, e)
    }

    /// One transaction, bounded in time like every request; `what` names
    /// it in the error when etcd does not answer.
    async fn transact(
        &self,
        txn: Txn,
        what: &str,
    ) -> Result<etcd_client::TxnResponse, ClusterError> {
        self.bounded(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| self.fail(what, e))
    }

    /// The lease, if it is surely alive now.
    fn live_lease(&self) -> Result<i64, ClusterError> {
        match *lock(&self.lease) {
            Some(l) if Instant::now() < l.valid_until => Ok(l.id),
            Some(_) => Err(self.fail(
                "no longer confirms this host's lease",
                "its keep-alive went unanswered for the lease's length (no quorum, or this process was paused)",
            )),
            None => match lock(&self.refused).clone() {
                Some(why) => Err(ClusterError::HostIdInUse(why)),
                None => Err(self.fail(
                    "has not granted this host a lease",
                    "unreachable or without quorum",
                )),
            },
        }
    }

    /// Keep a lease and the host's registration for as long as the node
    /// runs: register, then keep alive every third of the TTL; a lease
    /// lost (expired, or not confirmed in time) drops every ownership and
    /// registration starts over.
    async fn maintain(self: Arc<Self>) {
        let ttl = Duration::from_secs(self.cfg.lease_secs);
        loop {
            let has = lock(&self.lease).is_some();
            let pause = if has {
                match self.keep_alive().await {
                    Ok(()) => ttl / 3,
                    Err(e) => {
                        tracing::warn!("{e}");
                        if self.live_lease().is_err() {
                            self.lose_lease().await;
                        }
                        Duration::from_millis(250)
                    }
                }
            } else {
                match self.register().await {
                    Ok(()) => ttl / 3,
                    Err(e) => {
                        tracing::warn!("cannot register this host in the cluster: {e}");
                        Duration::from_secs(1)
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.stop.cancelled() => return,
            }
        }
    }

    /// Grant a lease and register this host under it. Another live
    /// supervisor with the same host id (or this one's predecessor, whose
    /// lease has not expired yet) holds the host key: then give the new
    /// lease back and try again later.
    async fn register(&self) -> Result<(), ClusterError> {
        self.register_once(false).await
    }

    /// [`Self::register`]; `again` after giving back this supervisor's own
    /// previous lease (once).
    async fn register_once(&self, again: bool) -> Result<(), ClusterError> {
        self.ensure_base().await?;
        let sent = Instant::now();
        let ttl = self.cfg.lease_secs as i64;
        let granted = self
            .bounded(|mut c| async move { c.lease_grant(ttl, None).await })
            .await
            .map_err(|e| self.fail("refused a lease", e))?;
        let id = granted.id();
        let key = host_key(&self.cfg.host_id);
        let now = self.registered_at.clone();
        let value = self.host_value();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key.clone(), value, Some(PutOptions::new().with_lease(id))),
                TxnOp::put(
                    member_key(&self.cfg.host_id),
                    serde_json::json!({"host": self.cfg.host_id, "registered_at": now}).to_string(),
                    None,
                ),
            ])
            .or_else([TxnOp::get(key.clone(), None)]);
        let done = self.transact(txn, "did not register this host").await?;
        if !done.succeeded() {
            let _ = self
                .bounded(|mut c| async move { c.lease_revoke(id).await })
                .await;
            let held = kv_of(&done.op_responses(), &key);
            // This supervisor's own previous lease, which it stopped trusting
            // (paused past a renewal) while etcd still kept it: everything
            // under it was given up already, so it is given back now rather
            // than waited out.
            if let Some(old) = held.as_ref().filter(|kv| self.is_mine(kv)) {
                let old = old.lease();
                let given_back = self
                    .bounded(|mut c| async move { c.lease_revoke(old).await })
                    .await;
                if given_back.is_ok() && !again {
                    return Box::pin(self.register_once(true)).await;
                }
                return Err(self.fail(
                    "still held this supervisor's previous lease",
                    "given back; registering again",
                ));
            }
            let why = self.conflict(&key, held, ttl);
            *lock(&self.refused) = Some(why.clone());
            return Err(ClusterError::HostIdInUse(why));
        }
        lock(&self.refused).take();
        *lock(&self.lease) = Some(Lease {
            id,
            valid_until: sent + Duration::from_secs(ttl as u64),
        });
        self.registered
            .store(true, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(host = %self.cfg.host_id, lease = id, "registered in the cluster");
        Ok(())
    }

    /// The host key's value: who, since when, and when its lease was last
    /// renewed (issue 43, LOW: `cluster status` showed a killed host alive
    /// for the rest of its lease; the renewal time tells them apart).
    fn host_value(&self) -> String {
        serde_json::json!({
            "host": self.cfg.host_id,
            "pid": std::process::id(),
            "registered_at": self.registered_at,
            "lease_secs": self.cfg.lease_secs,
            "renewed_at_ms": super::events::wall_ms(Instant::now()),
        })
        .to_string()
    }

    /// After a renewal: the host key says when (under the same lease, so
    /// it still goes with it). A failure is only logged: liveness shown,
    /// not ownership.
    async fn heartbeat(&self, lease: i64) {
        let key = host_key(&self.cfg.host_id);
        let value = self.host_value();
        let put = self
            .bounded(|mut c| {
                let (key, value) = (key.clone(), value.clone());
                async move {
                    c.put(key, value, Some(PutOptions::new().with_lease(lease)))
                        .await
                }
            })
            .await;
        if let Err(e) = put {
            tracing::debug!("cannot record this host's renewal: {e}");
        }
    }

    /// Whether a host key was written by this very supervisor (its pid and
    /// its start, as its value says).
    fn is_mine(&self, kv: &etcd_client::KeyValue) -> bool {
        let v: serde_json::Value = serde_json::from_slice(kv.value()).unwrap_or_default();
        kv.lease() != 0
            && v["pid"].as_u64() == Some(u64::from(std::process::id()))
            && v["registered_at"].as_str() == Some(self.registered_at.as_str())
    }

    /// Why the host key `key` is not this supervisor's to take (LOW of
    /// issue 43: it was reported as "unreachable or without quorum").
    fn conflict(&self, key: &str, held: Option<etcd_client::KeyValue>, ttl: i64) -> String {
        let host = &self.cfg.host_id;
        let Some(kv) = held else {
            return format!("host id {host}: its key {key} changed while it was registered");
        };
        if kv.lease() == 0 {
            return format!(
                "host id {host} cannot register: its key {key} holds no lease, so it never \
                 expires — it was written by hand or planted; remove it (`etcdctl del {key}`) \
                 if no supervisor runs as {host}"
            );
        }
        let v: serde_json::Value = serde_json::from_slice(kv.value()).unwrap_or_default();
        let pid = v["pid"]
            .as_u64()
            .map(|p| format!("pid {p}, "))
            .unwrap_or_default();
        let since = v["registered_at"]
            .as_str()
            .map(|t| format!("since {}", untrusted(t.as_bytes())))
            .unwrap_or_default();
        format!(
            "host id {host} is in use by another live supervisor ({pid}{since}) — two hosts \
             with one id, or this host's previous supervisor until its lease of {ttl} s \
             expires; give each host its own MINI_LETTA_HOST_ID"
        )
    }

    /// Make sure etcd has an epoch base (issue 43 §3). A new etcd, or one
    /// that lost its data, has none: it is created past every fence in the
    /// remote (only if still absent: another host may be doing the same),
    /// before this host takes anything — a take requires it, so no take
    /// ever stamps an epoch a fence already has.
    async fn ensure_base(&self) -> Result<(), ClusterError> {
        let got = self
            .bounded(|mut c| async move { c.get(EPOCH_BASE_KEY, None).await })
            .await
            .map_err(|e| self.fail("did not answer the epoch base", e))?;
        if !got.kvs().is_empty() {
            return Ok(());
        }
        let scan = self.scan.clone();
        let largest = tokio::task::spawn_blocking(move || scan())
            .await
            .map_err(|e| ClusterError::Config(format!("cannot read the remote's fences: {e}")))?
            .map_err(|e| ClusterError::Config(format!("cannot read the remote's fences: {e}")))?;
        let base = largest.saturating_add(1);
        let txn = Txn::new()
            .when([Compare::create_revision(
                EPOCH_BASE_KEY,
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(EPOCH_BASE_KEY, base.to_string(), None)]);
        let done = self.transact(txn, "did not set the epoch base").await?;
        if done.succeeded() {
            tracing::warn!(
                base,
                largest_fence_epoch = largest,
                "etcd had no epoch base (new, or it lost its data): set past every fence in the remote"
            );
        }
        Ok(())
    }

    /// One keep-alive round trip; the lease is trusted until its send time
    /// plus the TTL etcd answers. A TTL of 0 means etcd let it expire.
    async fn keep_alive(&self) -> Result<(), ClusterError> {
        let Some(lease) = *lock(&self.lease) else {
            return Ok(());
        };
        let sent = Instant::now();
        let answered = self
            .bounded(|mut c| async move {
                let (mut keeper, mut stream) = c.lease_keep_alive(lease.id).await?;
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await
            .map_err(|e| self.fail("did not renew this host's lease", e))?;
        match answered {
            Some(r) if r.ttl() > 0 => {
                {
                    let mut held = lock(&self.lease);
                    if let Some(l) = held.as_mut()
                        && l.id == lease.id
                    {
                        l.valid_until = sent + Duration::from_secs(r.ttl() as u64);
                    }
                }
                self.heartbeat(lease.id).await;
                Ok(())
            }
            _ => {
                tracing::warn!(lease = lease.id, "etcd let this host's lease expire");
                self.lose_lease().await;
                Ok(())
            }
        }
    }

    /// The lease is gone: so is every ownership under it.
    async fn lose_lease(&self) {
        let until = self.lost_at();
        lock(&self.lease).take();
        let owned: Vec<(String, i64)> = drain_epochs(&self.owned);
        for (agent, epoch) in owned {
            let _ = self.note(&agent, Change::Lost, epoch, until).await;
        }
    }

    /// The last instant this host surely held its lease: now, or when its
    /// lease ran out if that is past.
    fn lost_at(&self) -> Instant {
        let now = Instant::now();
        match *lock(&self.lease) {
            Some(l) => l.valid_until.min(now),
            None => now,
        }
    }

    /// Record an ownership change of `agent` that happened `at`. `Err`
    /// when the recorder could not keep it.
    async fn note(
        &self,
        agent: &str,
        change: Change,
        epoch: i64,
        at: Instant,
    ) -> Result<(), String> {
        let host = self.cfg.host_id.as_str();
        tracing::info!(agent, host, ?change, epoch, "agent ownership changed");
        let recorded = (self.recorder)(OwnerChange {
            agent: agent.to_string(),
            host: host.to_string(),
            change,
            epoch,
            at_ms: super::events::wall_ms(at),
        })
        .await;
        if let Err(e) = &recorded {
            tracing::error!(
                agent,
                ?change,
                epoch,
                "the ownership change was not recorded: {e}"
            );
        }
        recorded
    }

    /// Run an etcd request within [`Self::op_timeout`], on a fresh handle
    /// of the client each try. A request that never reached a member (the
    /// balanced channel handed it to a member that is down: connection
    /// refused), or that a member refused for want of a leader (an
    /// election under way), is made again until the bound — nothing was
    /// done, and another member, or the next leader, may answer.
    async fn bounded<T, F>(&self, mut request: impl FnMut(Client) -> F) -> Result<T, String>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.op_timeout();
        // One try gets a third of the bound: a member that accepts the
        // request and never answers (frozen, or its host paused) must not
        // cost the whole bound, and the balanced channel sends the next
        // try to a member with fewer requests waiting (issue 43, LOW).
        let attempt = (self.op_timeout() / 3).max(Duration::from_millis(300));
        let order = std::sync::atomic::Ordering::Relaxed;
        let mut member = self.preferred.load(order);
        loop {
            let now = tokio::time::Instant::now();
            let until = (now + attempt).min(deadline);
            let client = self
                .members
                .get(member % self.members.len().max(1))
                .unwrap_or(&self.client)
                .clone();
            match tokio::time::timeout_at(until, request(client)).await {
                Ok(Ok(v)) => {
                    self.preferred.store(member, order);
                    return Ok(v);
                }
                Ok(Err(e)) if never_sent(&e) && now + RESEND < deadline => {
                    tracing::debug!("etcd request not delivered ({e}): sent to the next member");
                    member += 1;
                    tokio::time::sleep(RESEND).await;
                }
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) if until < deadline => {
                    tracing::debug!(
                        "etcd request unanswered for {} ms: sent to the next member",
                        attempt.as_millis()
                    );
                    member += 1;
                }
                Err(_) => {
                    return Err(format!(
                        "no answer within {} ms (no quorum?)",
                        self.op_timeout().as_millis()
                    ));
                }
            }
        }
    }

    /// Stop keeping the lease and give it back (a clean stop): etcd
    /// deletes the host key and every owner key under it at once.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let sent = self.lost_at();
        let lease = lock(&self.lease).take();
        let owned: Vec<(String, i64)> = drain_epochs(&self.owned);
        let Some(l) = lease else { return };
        let revoked = self
            .bounded(|mut c| async move { c.lease_revoke(l.id).await })
            .await;
        // Stopping, this host acts on nothing after `sent` either way.
        let change = match revoked {
            Ok(_) => {
                tracing::info!(host = %self.cfg.host_id, "left the cluster");
                Change::Released
            }
            Err(e) => {
                tracing::warn!("cannot give the lease back ({e}); it expires by itself");
                Change::Lost
            }
        };
        for (agent, epoch) in &owned {
            let _ = self.note(agent, change, *epoch, sent).await;
        }
    }

    /// The cluster as etcd sees it now.
    pub async fn status(&self) -> Result<super::status::Status, ClusterError> {
        super::status::read(&self.cfg, self.client.clone()).await
    }
}

/// The pause before a request that was not delivered is sent again.
const RESEND: Duration = Duration::from_millis(50);

/// gRPC's `UNAVAILABLE`.
const UNAVAILABLE: i32 = 14;

/// Whether `e` says the request never reached a member: the connection
/// to the member the channel picked could not be made.
fn never_sent(e: &etcd_client::Error) -> bool {
    match e {
        // Not delivered (the member is down), or refused before it was
        // proposed (the member has no leader: an election is under way,
        // as right after the leader died) — either way nothing was done.
        etcd_client::Error::GRpcStatus(s) => {
            i32::from(s.code()) == UNAVAILABLE
                && (s.message().contains("connect") || s.message().contains("no leader"))
        }
        _ => false,
    }
}

/// An owner key's value as a message may show it: the host id, or a brief
/// visible form of a value that is none ([`host_from_etcd`]).
fn owner_shown(kv: &etcd_client::KeyValue) -> String {
    host_from_etcd(kv.value()).unwrap_or_else(|shown| shown)
}

/// Drain the owned agents, with the fence epoch each was taken in (what
/// the audit log records: unlike a revision, unique across etcd's losses).
fn drain_epochs(owned: &Mutex<HashMap<String, (i64, i64)>>) -> Vec<(String, i64)> {
    lock(owned).drain().map(|(a, (_, f))| (a, f)).collect()
}

/// The key-value of `key` among a transaction's `get` answers.
fn kv_of(responses: &[TxnOpResponse], key: &str) -> Option<etcd_client::KeyValue> {
    responses.iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g
            .kvs()
            .iter()
            .find(|kv| kv.key() == key.as_bytes())
            .cloned(),
        _ => None,
    })
}

/// The epoch base among a transaction's answers (0 when absent; a value
/// that is no plausible epoch is taken as 0 and said: etcd is not trusted).
fn epoch_base_in(responses: &[TxnOpResponse]) -> i64 {
    let Some(kv) = kv_of(responses, EPOCH_BASE_KEY) else {
        return 0;
    };
    match parse_epoch(kv.value()) {
        Some(b) => b,
        None => {
            tracing::warn!(
                value = %untrusted(kv.value()),
                "the epoch base in etcd is no epoch; taken as 0"
            );
            0
        }
    }
}

/// The first key-value of a transaction's `get` branch.
fn first_kv(responses: &[TxnOpResponse]) -> Option<etcd_client::KeyValue> {
    responses.iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().cloned(),
        _ => None,
    })
}

/// A third of the lease, between one and five seconds: etcd must answer
/// well within the lease, and a refusal must come in bounded time.
fn op_timeout(lease_secs: u64) -> Duration {
    Duration::from_millis((lease_secs * 1000 / 3).clamp(1000, 5000))
}

fn etcd_error(cfg: &ClusterConfig, what: &str, e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Etcd {
        endpoints: cfg.endpoints.join(","),
        what: what.to_string(),
        message: e.to_string(),
    }
}
