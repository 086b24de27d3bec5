//! The supervisor's egress state and the per-child loop: the handshake
//! with the child stage, the endpoint in the child's namespace, and the
//! accept loop that hands each connection to [`super::proxy::session`].
//!
//! Who a connection belongs to is fixed by the listener it came on — one
//! per child, made for the child the supervisor's table names — never by
//! anything the connection says. Everything a child can make the proxy
//! hold is bounded: connections per agent (`[network] max_connections`)
//! and in all ([`MAX_TOTAL`]), threads for policy reads ([`READERS`]) and
//! for names (a share per agent: [`super::resolver`]), records queued for
//! the log, new connections per second per agent ([`super::pace`]);
//! connections are tokio tasks, never threads.

use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::log::{NetRecord, Verdict};
use super::shared::lock;
pub use super::shared::{ChildRef, Egress, MAX_TOTAL, Policy, READERS, Slot};

/// How long the child stage has to say it is in its namespace.
const HANDSHAKE: Duration = Duration::from_secs(30);

impl Egress {
    /// Serve child `child` (launcher pid `pid`), whose stage holds the
    /// other end of `sync` as descriptor 4: until the child ends.
    pub(crate) fn serve_child(self: &Arc<Self>, sync: StdUnixStream, child: ChildRef, pid: u32) {
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
                () = self.pace.wait(&child.agent) => {}
            }
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
                let record = NetRecord {
                    time: super::log::now(),
                    agent: child.agent.clone(),
                    role: child.role.clone(),
                    child: child.id,
                    method: String::new(),
                    host: String::new(),
                    port: None,
                    address: None,
                    verdict: Verdict::Denied,
                    reason: Some(why.clone()),
                    bytes_up: 0,
                    bytes_down: 0,
                    duration_ms: 0,
                };
                self.audit_denied(&record).await;
                let answer = super::http::Refusal::new(503, why).response();
                let _ = stream.try_write(&answer);
                drop(stream);
                self.record(record).await;
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
}
