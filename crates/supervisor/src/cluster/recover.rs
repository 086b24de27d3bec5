//! `mini-letta cluster recover` (issue 43 §3): after etcd lost its data its
//! revisions start again from 1, so every take's epoch is below the epochs
//! the remote's fences carry and no host can take any agent over. Fencing
//! stays intact only if epochs keep growing: this raises the cluster's
//! epoch base ([`EPOCH_BASE_KEY`]) past the largest fence epoch, in
//! one compare-and-swap, so every later take stamps a larger one. It never
//! lowers the base, and it changes nothing else: ownership is still taken
//! the usual way, and a host whose owner key etcd lost confirms nothing.

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

use super::config::ClusterConfig;
use super::error::ClusterError;
use super::keys::{EPOCH_BASE_KEY, parse_epoch, untrusted};

/// What a recovery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Raised {
    /// The base before (0 when absent).
    pub before: i64,
    /// The base after (unchanged when it was already high enough).
    pub after: i64,
}

/// Raise the epoch base to at least `at_least` with `client`.
pub(crate) async fn raise_base(
    cfg: &ClusterConfig,
    mut client: Client,
    at_least: i64,
) -> Result<Raised, ClusterError> {
    let fail = |what: &str, e: String| ClusterError::Etcd {
        endpoints: cfg.endpoints.join(","),
        what: what.into(),
        message: e,
    };
    // Another recovery may race this one: compare and retry.
    for _ in 0..5 {
        let got = client
            .get(EPOCH_BASE_KEY, None)
            .await
            .map_err(|e| fail("did not answer the epoch base", e.to_string()))?;
        let kv = got.kvs().first();
        let before = match kv {
            None => 0,
            Some(kv) => parse_epoch(kv.value()).ok_or_else(|| {
                ClusterError::Config(format!(
                    "the epoch base in etcd ({EPOCH_BASE_KEY}) is no epoch: {}",
                    untrusted(kv.value())
                ))
            })?,
        };
        if before >= at_least {
            return Ok(Raised {
                before,
                after: before,
            });
        }
        let unchanged = match kv {
            None => Compare::create_revision(EPOCH_BASE_KEY, CompareOp::Equal, 0),
            Some(kv) => Compare::mod_revision(EPOCH_BASE_KEY, CompareOp::Equal, kv.mod_revision()),
        };
        let txn = Txn::new().when([unchanged]).and_then([TxnOp::put(
            EPOCH_BASE_KEY,
            at_least.to_string(),
            None,
        )]);
        let done = client
            .txn(txn)
            .await
            .map_err(|e| fail("did not raise the epoch base", e.to_string()))?;
        if done.succeeded() {
            return Ok(Raised {
                before,
                after: at_least,
            });
        }
    }
    Err(fail(
        "did not raise the epoch base",
        "it changed under every try (another recovery running?)".into(),
    ))
}

/// [`raise_base`] from a process without a runtime (the CLI).
pub fn raise_base_blocking(cfg: &ClusterConfig, at_least: i64) -> Result<Raised, ClusterError> {
    super::status::blocking(cfg, "did not raise the epoch base", |client| {
        raise_base(cfg, client, at_least)
    })
}
