//! Name resolution for the proxy, fair between agents.
//!
//! The system resolver (`getaddrinfo`, so `/etc/hosts`, NSS and
//! `resolv.conf` behave as everywhere else on the host) blocks, and a
//! resolution cannot be cancelled: a thread asking a name server that
//! never answers stays until the resolver's own timeouts end, long after
//! the connection that asked has been answered. So the threads are the
//! resource to share: each agent resolves at most [`PER_AGENT`] names at
//! once, all agents together at most [`TOTAL`], a thread holds both of its
//! permits until the resolver returns, and every wait for a permit is
//! bounded ([`PERMIT_WAIT`]). A tenant flooding slow names spends its own
//! share and is refused quickly; another tenant's share stays free.

use std::collections::HashMap;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Names one agent resolves at once.
pub const PER_AGENT: usize = 4;
/// Names resolved at once, all agents together (threads a flood of many
/// tenants can hold).
pub const TOTAL: usize = 64;
/// The longest wait for a permit (an agent's share or the total).
pub const PERMIT_WAIT: Duration = Duration::from_secs(2);
/// How long a name may take to resolve before the connection is refused.
pub const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// Why a name was not resolved (the proxy's 502 says it).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    #[error("this agent already has {PER_AGENT} names resolving; try again later")]
    AgentBusy,
    #[error("the resolver is busy ({TOTAL} names resolving for all agents)")]
    AllBusy,
    #[error("no answer within {}s", ANSWER_WAIT.as_secs())]
    NoAnswer,
    #[error("{0}")]
    Failed(String),
}

/// The shares: one semaphore per agent with names resolving, one for all.
pub struct Resolver {
    total: Arc<Semaphore>,
    agents: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Default for Resolver {
    fn default() -> Self {
        Self {
            total: Arc::new(Semaphore::new(TOTAL)),
            agents: Mutex::new(HashMap::new()),
        }
    }
}

impl Resolver {
    /// The addresses of `name` for `agent` (deduplicated, in the
    /// resolver's order).
    pub async fn resolve(
        &self,
        agent: &str,
        name: &str,
        port: u16,
    ) -> Result<Vec<IpAddr>, ResolveError> {
        let permits = self.permits(agent).await?;
        let n = name.to_string();
        let task = tokio::task::spawn_blocking(move || {
            // Held until the system resolver returns, however late.
            let _permits = permits;
            (n.as_str(), port)
                .to_socket_addrs()
                .map(|it| it.map(|a| a.ip()).collect::<Vec<_>>())
        });
        match tokio::time::timeout(ANSWER_WAIT, task).await {
            Err(_) => Err(ResolveError::NoAnswer),
            Ok(Err(e)) => Err(ResolveError::Failed(e.to_string())),
            Ok(Ok(Err(e))) => Err(ResolveError::Failed(e.to_string())),
            Ok(Ok(Ok(mut v))) => {
                let mut seen = std::collections::HashSet::new();
                v.retain(|ip| seen.insert(*ip));
                Ok(v)
            }
        }
    }

    /// One permit of `agent`'s share, then one of the total, each waited
    /// for at most [`PERMIT_WAIT`].
    async fn permits(
        &self,
        agent: &str,
    ) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), ResolveError> {
        let share = self.share(agent);
        let own = tokio::time::timeout(PERMIT_WAIT, share.acquire_owned())
            .await
            .map_err(|_| ResolveError::AgentBusy)?
            .map_err(|_| ResolveError::AllBusy)?;
        let all = tokio::time::timeout(PERMIT_WAIT, self.total.clone().acquire_owned())
            .await
            .map_err(|_| ResolveError::AllBusy)?
            .map_err(|_| ResolveError::AllBusy)?;
        Ok((own, all))
    }

    /// `agent`'s semaphore; shares nobody holds or waits for are dropped
    /// (the map is bounded by the agents with names resolving).
    fn share(&self, agent: &str) -> Arc<Semaphore> {
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        agents.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < PER_AGENT);
        agents
            .entry(agent.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(PER_AGENT)))
            .clone()
    }

    /// Names resolving for `agent` now.
    pub fn resolving(&self, agent: &str) -> usize {
        let agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        agents
            .get(agent)
            .map_or(0, |s| PER_AGENT - s.available_permits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_agents_share_is_its_own() {
        let r = Resolver::default();
        // Owl's share held (as by resolutions that do not return).
        let mut held = Vec::new();
        for _ in 0..PER_AGENT {
            held.push(r.permits("owl").await.unwrap());
        }
        assert_eq!(r.resolving("owl"), PER_AGENT);
        tokio::time::pause();
        assert_eq!(r.permits("owl").await.unwrap_err(), ResolveError::AgentBusy);
        tokio::time::resume();
        // Wren still resolves at once.
        let before = std::time::Instant::now();
        let addrs = r.resolve("wren", "localhost", 80).await.unwrap();
        assert!(addrs.iter().all(|ip| ip.is_loopback()), "{addrs:?}");
        assert!(before.elapsed() < PERMIT_WAIT);
        drop(held);
        assert_eq!(r.resolving("owl"), 0);
        let _again = r.permits("owl").await.unwrap();
    }

    #[tokio::test]
    async fn the_total_bounds_all_agents_together() {
        let r = Resolver::default();
        let mut held = Vec::new();
        for i in 0..TOTAL / PER_AGENT {
            for _ in 0..PER_AGENT {
                held.push(r.permits(&format!("a{i}")).await.unwrap());
            }
        }
        tokio::time::pause();
        assert_eq!(r.permits("late").await.unwrap_err(), ResolveError::AllBusy);
        // The late agent's own permit was given back with the refusal.
        assert_eq!(r.resolving("late"), 0);
    }
}
