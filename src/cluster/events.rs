//! Ownership changes, recorded in one place: each is logged and appended
//! to the home's owner log (`paths::Home::cluster_owner_log`), one JSON
//! line written whole, so the soak can check from every host's record that
//! an agent never had two live owners. (When the audit log lands, this
//! function is where an owner change joins it.)

use std::io::Write;

use serde::Serialize;

use crate::paths::Home;

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

/// One line of the owner log.
#[derive(Debug, Clone, Serialize)]
pub struct OwnerChange<'a> {
    pub agent: &'a str,
    pub host: &'a str,
    pub change: Change,
    /// The owner key's create revision: the ownership's epoch.
    pub epoch: i64,
    /// Wall-clock time in milliseconds since the epoch.
    pub at_ms: u128,
}

/// Record an ownership change of `agent` on `host`.
pub fn owner_changed(home: &Home, agent: &str, host: &str, change: Change, epoch: i64) {
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let event = OwnerChange {
        agent,
        host,
        change,
        epoch,
        at_ms,
    };
    tracing::info!(agent, host, ?change, epoch, "agent ownership changed");
    let Ok(mut line) = serde_json::to_vec(&event) else {
        return;
    };
    line.push(b'\n');
    let path = home.cluster_owner_log();
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(&line));
    if let Err(e) = written {
        tracing::warn!(
            "cannot record the ownership change in {}: {e}",
            path.display()
        );
    }
}
