//! The agents a node owns: taking or confirming an owner key under the
//! node's lease, the fence epoch of each, and giving them back.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::super::error::ClusterError;
use super::super::events::Change;
use super::super::keys::{EPOCH_BASE_KEY, owner_key};
use super::{Node, Owned, epoch_base_in, first_kv, kv_of, lock, owner_shown};

impl Node {
    /// Own `agent`: confirm this host's ownership, or take it when nobody
    /// owns it (the key created under this host's lease only if absent).
    /// Another owner is [`ClusterError::NotOwner`]; etcd not answering,
    /// within a few tries, is [`ClusterError::Etcd`].
    pub async fn own(&self, agent: &str) -> Result<Owned, ClusterError> {
        // A leader election takes about one election timeout.
        const ELECTION: crate::retry::Policy = crate::retry::Policy::backoff(
            3,
            Duration::from_millis(300),
            Duration::from_millis(300),
        );
        ELECTION
            .run_async(
                |e| matches!(e, ClusterError::Etcd { .. }) && !self.stop.is_cancelled(),
                || self.own_once(agent),
            )
            .await
    }

    async fn own_once(&self, agent: &str) -> Result<Owned, ClusterError> {
        let lease = self.live_lease()?;
        let key = owner_key(agent);
        // The epoch base is read in the same transaction: the fence epoch
        // of a take is the base then plus the take's revision.
        let base = EPOCH_BASE_KEY;
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                // No take without an epoch base (see `ensure_base`).
                Compare::create_revision(base, CompareOp::Greater, 0),
            ])
            .and_then([
                TxnOp::put(
                    key.clone(),
                    self.cfg.host_id.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(base, None),
            ])
            .or_else([TxnOp::get(key.clone(), None), TxnOp::get(base, None)]);
        let done = self
            .transact(txn, "did not answer who owns the agent")
            .await?;
        let responses = done.op_responses();
        if !done.succeeded() && kv_of(&responses, EPOCH_BASE_KEY).is_none() {
            // etcd lost its data since this host registered: set the base
            // again, then the caller's retry takes.
            self.ensure_base().await?;
            return Err(self.fail("had no epoch base", "it was set again; retrying"));
        }
        let base = epoch_base_in(&responses);
        if done.succeeded() {
            let epoch = done.header().map(|h| h.revision()).unwrap_or_default();
            return self.taken(agent, epoch, base).await;
        }
        let Some(kv) = kv_of(&responses, &key) else {
            // Deleted between the compare and the read: ask again.
            return Err(self.fail("changed the owner key while it was read", "retrying"));
        };
        if kv.lease() == lease && kv.value() == self.cfg.host_id.as_bytes() {
            let epoch = kv.create_revision();
            // The fence epoch it was taken with (the base may have grown
            // since; the record of the take keeps the one it claimed with).
            let mut owned = lock(&self.owned);
            let fence = owned
                .get(agent)
                .filter(|(e, _)| *e == epoch)
                .map_or(epoch.saturating_add(base), |(_, f)| *f);
            owned.insert(agent.to_string(), (epoch, fence));
            return Ok(Owned::Already(epoch));
        }
        self.forget(agent, Change::Lost, self.lost_at()).await;
        Err(ClusterError::NotOwner {
            agent: agent.to_string(),
            owner: owner_shown(&kv),
        })
    }

    /// This host just took `agent` in `epoch`: recorded before anything
    /// acts on it — a take the audit log did not keep is given back.
    async fn taken(&self, agent: &str, epoch: i64, base: i64) -> Result<Owned, ClusterError> {
        let fence = epoch.saturating_add(base);
        lock(&self.owned).insert(agent.to_string(), (epoch, fence));
        match self.note(agent, Change::Taken, fence, Instant::now()).await {
            Ok(()) => Ok(Owned::Taken(epoch)),
            Err(e) => {
                if let Err(r) = self.release(agent).await {
                    tracing::warn!(agent, "cannot give back an unrecorded take: {r}");
                }
                Err(ClusterError::Unrecorded(e))
            }
        }
    }

    /// The epoch this host owns `agent` in, by its own record (no etcd
    /// request; a fenced push confirms with [`Self::confirm`]).
    pub fn epoch(&self, agent: &str) -> Option<i64> {
        self.live_lease().ok()?;
        lock(&self.owned).get(agent).map(|(e, _)| *e)
    }

    /// The fence epoch this host owns `agent` in (what its fence commits
    /// are stamped with): the epoch plus the cluster's epoch base at the
    /// take ([`EPOCH_BASE_KEY`]).
    pub(crate) fn fence_epoch(&self, agent: &str) -> Option<i64> {
        self.live_lease().ok()?;
        lock(&self.owned).get(agent).map(|(_, f)| *f)
    }

    /// Whether etcd still says this host owns `agent` in `epoch`: the owner
    /// key has that create revision, this host's value and its lease.
    pub async fn confirm(&self, agent: &str, epoch: i64) -> Result<(), ClusterError> {
        let lease = self.live_lease()?;
        let key = owner_key(agent);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, epoch),
                Compare::lease(key.clone(), CompareOp::Equal, lease),
                Compare::value(key.clone(), CompareOp::Equal, self.cfg.host_id.clone()),
            ])
            .or_else([TxnOp::get(key, None)]);
        let done = self
            .transact(txn, "did not confirm this host's ownership")
            .await?;
        if done.succeeded() {
            return Ok(());
        }
        self.forget(agent, Change::Lost, self.lost_at()).await;
        Err(self.not_ours(agent, &done.op_responses()))
    }

    /// [`Self::confirm`] from a blocking thread (a sync runs on one).
    pub(crate) fn confirm_blocking(&self, agent: &str, epoch: i64) -> Result<(), ClusterError> {
        self.runtime.block_on(self.confirm(agent, epoch))
    }

    /// Give `agent` back: its owner key is deleted if it is still this
    /// host's. Another owner is named.
    pub async fn release(&self, agent: &str) -> Result<(), ClusterError> {
        let lease = self.live_lease()?;
        let sent = Instant::now();
        let key = owner_key(agent);
        let txn = Txn::new()
            .when([
                Compare::lease(key.clone(), CompareOp::Equal, lease),
                Compare::value(key.clone(), CompareOp::Equal, self.cfg.host_id.clone()),
            ])
            .and_then([TxnOp::delete(key.clone(), None)])
            .or_else([TxnOp::get(key, None)]);
        let done = self.transact(txn, "did not release the agent").await?;
        if done.succeeded() {
            self.forget(agent, Change::Released, sent).await;
            return Ok(());
        }
        self.forget(agent, Change::Lost, self.lost_at()).await;
        Err(self.not_ours(agent, &done.op_responses()))
    }

    /// Why a transaction on this host's owner key failed: another host owns
    /// the agent (named from the key read back), or nobody does.
    fn not_ours(&self, agent: &str, read_back: &[TxnOpResponse]) -> ClusterError {
        match first_kv(read_back) {
            Some(kv) => ClusterError::NotOwner {
                agent: agent.to_string(),
                owner: owner_shown(&kv),
            },
            None => ClusterError::NotOwned {
                host: self.cfg.host_id.clone(),
                agent: agent.to_string(),
            },
        }
    }

    /// Drop `agent` from this host's record, noting why and when.
    async fn forget(&self, agent: &str, change: Change, at: Instant) {
        let epoch = lock(&self.owned).remove(agent).map(|(_, f)| f);
        if let Some(epoch) = epoch {
            let _ = self.note(agent, change, epoch, at).await;
        }
    }
}
