//! Memory leases: the children of one agent share one memory working tree,
//! so edit-then-commit must not interleave (two turns each inserting a line
//! into `human.md` would otherwise commit each other's half-written file, or
//! lose a line). A child takes the agent's lease before it edits and gives
//! it back after its commit; the supervisor decides who holds it from its
//! child table, and a child's exit returns it whatever the child did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// How long a child waits for the lease before its edit is refused.
pub const LEASE_WAIT: Duration = Duration::from_secs(120);

/// Who holds a lease: a child (by the id in the child table) or a CLI
/// connection (by the id the supervisor gave it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Holder {
    Child(u64),
    Connection(u64),
}

#[derive(Default)]
pub struct Leases {
    /// agent id → its lease.
    locks: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    /// holder → the lease it holds.
    held: Mutex<HashMap<Holder, OwnedMutexGuard<()>>>,
}

#[derive(Debug, thiserror::Error)]
#[error("another turn of this agent kept its memory lease for {0:?}; try again")]
pub struct LeaseTimeout(pub Duration);

impl Leases {
    fn lock_of(&self, agent: &str) -> Arc<AsyncMutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(agent.to_string()).or_default().clone()
    }

    pub fn holds(&self, holder: Holder) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.contains_key(&holder)
    }

    /// Give `holder` the lease of `agent` (at once when it already holds
    /// it; a holder has one lease at a time).
    pub async fn take(
        &self,
        agent: &str,
        holder: Holder,
        wait: Duration,
    ) -> Result<(), LeaseTimeout> {
        if self.holds(holder) {
            return Ok(());
        }
        let guard = self.hold(agent, wait).await?;
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.insert(holder, guard);
        Ok(())
    }

    /// The lease of `agent` for the caller's own use (a commit by a child
    /// without one, or by the operator): held until the guard drops.
    pub async fn hold(
        &self,
        agent: &str,
        wait: Duration,
    ) -> Result<OwnedMutexGuard<()>, LeaseTimeout> {
        let lock = self.lock_of(agent);
        tokio::time::timeout(wait, lock.lock_owned())
            .await
            .map_err(|_| LeaseTimeout(wait))
    }

    /// Return `holder`'s lease, if it holds one.
    pub fn release(&self, holder: Holder) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(&holder).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_holder_per_agent_until_release() {
        let l = Leases::default();
        let (c1, c2, c3) = (Holder::Child(1), Holder::Child(2), Holder::Connection(1));
        l.take("a", c1, LEASE_WAIT).await.unwrap();
        l.take("a", c1, LEASE_WAIT).await.unwrap();
        assert!(l.take("a", c2, Duration::from_millis(20)).await.is_err());
        assert!(l.take("a", c3, Duration::from_millis(20)).await.is_err());
        l.take("b", Holder::Child(3), Duration::from_millis(20))
            .await
            .unwrap();
        assert!(l.hold("a", Duration::from_millis(20)).await.is_err());
        assert!(l.release(c1));
        assert!(!l.release(c1));
        l.take("a", c3, Duration::from_millis(20)).await.unwrap();
        assert!(!l.holds(c2));
        assert!(l.release(c3));
    }
}
