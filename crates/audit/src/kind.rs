//! Record kinds this program writes.

pub const SPAWN: &str = "spawn";
pub const EXIT: &str = "exit";
pub const TOOL: &str = "tool";
pub const COMMIT: &str = "commit";
pub const MERGE: &str = "merge";
pub const SYNC: &str = "sync";
pub const MODEL: &str = "model";
pub const DENIED: &str = "denied";
pub const BUDGET: &str = "budget";
pub const CONFIG: &str = "config";
pub const START: &str = "start";
pub const TORN: &str = "torn";
/// An agent's owner changed (several hosts, `docs/cluster.md`).
pub const OWNER: &str = "owner";
/// A connection through the egress proxy ended, with its bytes.
pub const EGRESS: &str = "egress";
