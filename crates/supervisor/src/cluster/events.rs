//! Ownership changes, recorded in one place: each is logged and handed to
//! the recorder the supervisor gave its node — the audit log, where it is
//! an `owner` record (`supervisor::audit_records::owner_changed`). A soak
//! reads every host's records back and checks that an agent never had two
//! live owners at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// What happened to this host's ownership of an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Taken (the owner key created under this host's lease).
    Taken,
    /// Given back (`agent release`, a clean stop, a failed take-over).
    Released,
    /// Found gone: the lease expired or another host owns it.
    Lost,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Taken => "taken",
            Change::Released => "released",
            Change::Lost => "lost",
        }
    }
}

/// One ownership change of one agent on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerChange {
    pub agent: String,
    pub host: String,
    pub change: Change,
    /// The ownership's fence epoch: the owner key's create revision plus
    /// the cluster's epoch base (issue 43 §3), as its fences are stamped.
    pub epoch: i64,
    /// Wall-clock milliseconds since the Unix epoch of the instant that
    /// bounds this host's ownership: for `taken`, when etcd's answer came
    /// (it acted on nothing before); for `released`, when the release was
    /// sent (nothing was written after); for `lost`, the last instant its
    /// lease was surely alive, or when the loss was noticed if earlier.
    pub at_ms: u128,
}

/// Where a node's owner changes go. `Err` when the change could not be
/// recorded: a take is then given back rather than acted on.
pub type Recorder = Arc<
    dyn Fn(OwnerChange) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync,
>;

/// `at` (a monotonic instant, past or future) on the wall clock, in
/// milliseconds since the Unix epoch.
pub(crate) fn wall_ms(at: Instant) -> u128 {
    let now = Instant::now();
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    if at >= now {
        wall + at.duration_since(now).as_millis()
    } else {
        wall.saturating_sub(now.duration_since(at).as_millis())
    }
}
