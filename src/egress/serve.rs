//! The supervisor's egress state and the per-child loop: the handshake
//! with the child stage, the endpoint in the child's namespace, and the
//! accept loop that hands each connection to [`super::proxy::session`].
//!
//! Who a connection belongs to is fixed by the listener it came on — one
//! per child, made for the child the supervisor's table names — never by
//! anything the connection says. Everything a child can make the proxy
//! hold is bounded: connections per agent (`[network] max_connections`)
//! and in all ([`MAX_TOTAL`]), blocking threads for reads and DNS
//! ([`BLOCKING`]), records queued for the log; connections are tokio
//! tasks, never threads.

use std::collections::HashMap;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::allow::AllowList;
use super::config::NetworkConfig;
use super::log::{LogWriter, NetRecord, Verdict};
use super::netns::NetnsWorker;
use crate::paths::Home;

/// Connections through the proxy at once, all agents together.
pub const MAX_TOTAL: usize = 1024;
/// Blocking tasks (policy reads, name resolution) at once.
pub const BLOCKING: usize = 8;
/// A policy read is reused for this long (a flood of connections costs
/// one read of the files per agent per interval).
const POLICY_TTL: Duration = Duration::from_secs(1);
/// How long a name may take to resolve (and wait for a resolver).
const DNS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the child stage has to say it is in its namespace.
const HANDSHAKE: Duration = Duration::from_secs(30);

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
    home: Home,
    log: Option<LogWriter>,
    netns: NetnsWorker,
    blocking: Arc<Semaphore>,
    total: Arc<Semaphore>,
    active: Mutex<HashMap<String, usize>>,
    policies: Mutex<HashMap<String, (Instant, Arc<Policy>)>>,
    children: Mutex<HashMap<u64, CancellationToken>>,
}

/// A held connection slot: one of the agent's and one of all.
pub struct Slot {
    egress: Arc<Egress>,
    agent: String,
    _total: OwnedSemaphorePermit,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
            blocking: Arc::new(Semaphore::new(BLOCKING)),
            total: Arc::new(Semaphore::new(MAX_TOTAL)),
            active: Mutex::new(HashMap::new()),
            policies: Mutex::new(HashMap::new()),
            children: Mutex::new(HashMap::new()),
        }
    }

    /// Serve child `child` (launcher pid `pid`), whose stage holds the
    /// other end of `sync` as descriptor 4: until the child ends.
    pub fn serve_child(self: &Arc<Self>, sync: StdUnixStream, child: ChildRef, pid: u32) {
        let token = CancellationToken::new();
        lock(&self.children).insert(child.id, token.clone());
        let egress = self.clone();
        tokio::spawn(async move {
            let id = child.id;
            if let Err(e) = egress.run_child(sync, Arc::new(child), pid, &token).await {
                tracing::warn!(child = id, "egress: {e}");
            }
            lock(&egress.children).remove(&id);
        });
    }

    /// Child `id` has ended: close its endpoint and its connections.
    pub fn child_ended(&self, id: u64) {
        if let Some(t) = lock(&self.children).remove(&id) {
            t.cancel();
        }
    }

    async fn run_child(
        self: &Arc<Self>,
        sync: StdUnixStream,
        child: Arc<ChildRef>,
        pid: u32,
        token: &CancellationToken,
    ) -> Result<(), String> {
        sync.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut sync = tokio::net::UnixStream::from_std(sync).map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        tokio::select! {
            r = tokio::time::timeout(HANDSHAKE, sync.read(&mut byte)) => match r {
                Ok(Ok(1)) if byte[0] == b'n' => {}
                // The child ended (or failed) before its namespace was up.
                _ => return Ok(()),
            },
            () = token.cancelled() => return Ok(()),
        }
        let listener = match self.netns.listener(pid, super::PORT).await {
            Ok(l) => l,
            Err(e) => {
                // The child goes on without network, and is told so.
                let _ = sync.write_all(b"x").await;
                return Err(format!(
                    "no proxy endpoint for child {} of agent {}: {e}",
                    child.id, child.agent
                ));
            }
        };
        let listener = TcpListener::from_std(listener).map_err(|e| e.to_string())?;
        sync.write_all(b"g").await.map_err(|e| e.to_string())?;
        drop(sync);
        loop {
            tokio::select! {
                () = token.cancelled() => return Ok(()),
                r = listener.accept() => match r {
                    Ok((stream, _)) => self.accepted(stream, &child, token).await,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin.
                        tracing::warn!(child = child.id, "egress: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    }

    /// Start a session for `stream`, or refuse it at once when a limit is
    /// reached.
    async fn accepted(
        self: &Arc<Self>,
        stream: TcpStream,
        child: &Arc<ChildRef>,
        token: &CancellationToken,
    ) {
        let policy = self.policy(&child.agent).await;
        let slot = if self.log.is_none() {
            Err("the network log cannot be written".to_string())
        } else {
            self.slot(&child.agent, policy.config.max_connections)
        };
        match slot {
            Ok(slot) => {
                let (egress, child, cancel) = (self.clone(), child.clone(), token.child_token());
                tokio::spawn(super::proxy::session(
                    egress, child, stream, policy, cancel, slot,
                ));
            }
            Err(why) => {
                // Inline, without a task: a flood is paced by this loop.
                let answer = super::http::Refusal::new(503, why.clone()).response();
                let _ = stream.try_write(&answer);
                drop(stream);
                self.record(NetRecord {
                    time: super::log::now(),
                    agent: child.agent.clone(),
                    role: child.role.clone(),
                    child: child.id,
                    method: String::new(),
                    host: String::new(),
                    port: None,
                    address: None,
                    verdict: Verdict::Denied,
                    reason: Some(why),
                    bytes_up: 0,
                    bytes_down: 0,
                    duration_ms: 0,
                })
                .await;
            }
        }
    }

    fn slot(self: &Arc<Self>, agent: &str, max: usize) -> Result<Slot, String> {
        let total = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| format!("too many connections through the proxy ({MAX_TOTAL})"))?;
        let mut active = lock(&self.active);
        let n = active.entry(agent.to_string()).or_default();
        if *n >= max {
            return Err(format!(
                "too many connections at once for agent {agent} ({max}, [network] max_connections)"
            ));
        }
        *n += 1;
        Ok(Slot {
            egress: self.clone(),
            agent: agent.to_string(),
            _total: total,
        })
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
    /// [`POLICY_TTL`] (off the async workers).
    async fn policy(&self, agent: &str) -> Arc<Policy> {
        if let Some((at, p)) = lock(&self.policies).get(agent)
            && at.elapsed() < POLICY_TTL
        {
            return p.clone();
        }
        let (home, id) = (self.home.clone(), agent.to_string());
        let read = async {
            let _permit = self.blocking.acquire().await.ok()?;
            tokio::task::spawn_blocking(move || load(&home, &id))
                .await
                .ok()
        };
        let policy = Arc::new(read.await.unwrap_or_else(|| Policy {
            config: NetworkConfig::default(),
            config_error: Some("the policy could not be read".into()),
            list: Ok(AllowList::default()),
        }));
        let mut cache = lock(&self.policies);
        // Bounded by the agents with children: stale entries go.
        cache.retain(|_, (at, _)| at.elapsed() < POLICY_TTL * 60);
        cache.insert(agent.to_string(), (Instant::now(), policy.clone()));
        policy
    }

    /// Resolve `name` (off the async workers, [`BLOCKING`] at once: the
    /// permit is held by the resolving thread, so a hung resolver cannot
    /// pile threads up).
    pub async fn resolve(&self, name: &str, port: u16) -> Result<Vec<std::net::IpAddr>, String> {
        use std::net::ToSocketAddrs;
        let wait = DNS_TIMEOUT;
        let permit = tokio::time::timeout(wait, self.blocking.clone().acquire_owned())
            .await
            .map_err(|_| "the resolver is busy".to_string())?
            .map_err(|_| "the resolver is gone".to_string())?;
        let n = name.to_string();
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            (n.as_str(), port)
                .to_socket_addrs()
                .map(|it| it.map(|a| a.ip()).collect::<Vec<_>>())
        });
        match tokio::time::timeout(wait, task).await {
            Err(_) => Err(format!("no answer within {}s", wait.as_secs())),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Ok(Ok(mut v))) => {
                v.dedup();
                Ok(v)
            }
        }
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
