//! Several hosts, one owner per agent (issue 35): membership and ownership
//! in etcd, for supervisors that share a git remote.
//!
//! Each clustered supervisor registers its host under a lease it keeps
//! alive ([`node::Node`]); before it changes an agent's memory or
//! conversations it owns the agent — the key `/mini-letta/agents/<id>/owner`
//! created under that lease in a transaction that creates it only if it
//! is absent. Ownership is kept while the lease lives and given back by a
//! clean stop or `agent release`. A host whose lease expired (paused,
//! partitioned) writes nothing others see: every push is fenced, by an
//! etcd transaction right before it and by the remote's own fence ref
//! ([`crate::memfs::fence`]), which a new owner claims before anything else.
//!
//! Keys (values are plain text or JSON; none is trusted beyond parsing):
//!
//! | key | value | lease |
//! |---|---|---|
//! | `/mini-letta/members/<host>` | `{"host", "registered_at"}` | none: the host was seen |
//! | `/mini-letta/hosts/<host>` | `{"host", "pid", "registered_at"}` | the host's: alive |
//! | `/mini-letta/agents/<id>/owner` | the owner's host id | the owner's |

pub mod config;
pub mod events;
pub mod handle;
pub mod node;
pub mod status;

pub use config::ClusterConfig;
pub use events::{Change, OwnerChange, Recorder};
pub use handle::Handle;
pub use node::{Node, Owned};

/// Every key this program writes starts here.
pub const PREFIX: &str = "/mini-letta/";

/// The key naming `agent`'s owner.
pub fn owner_key(agent: &str) -> String {
    format!("{PREFIX}agents/{agent}/owner")
}

/// The leased key saying `host` is alive.
pub fn host_key(host: &str) -> String {
    format!("{PREFIX}hosts/{host}")
}

/// The lasting key saying `host` was a member once.
pub fn member_key(host: &str) -> String {
    format!("{PREFIX}members/{host}")
}

/// Why a clustered operation could not go ahead.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
    #[error("invalid cluster configuration: {0}")]
    Config(String),
    /// etcd could not be asked (down, no quorum, too slow): fail closed.
    #[error("etcd ({endpoints}) {what}: {message}")]
    Etcd {
        endpoints: String,
        what: String,
        message: String,
    },
    /// Another host owns the agent.
    #[error("agent {agent} is owned by host {owner}")]
    NotOwner { agent: String, owner: String },
    /// This host does not own the agent (any more).
    #[error("this host ({host}) does not own agent {agent}")]
    NotOwned { host: String, agent: String },
    /// An ownership taken that the audit log did not keep (given back).
    #[error("the audit log did not record the ownership change: {0}")]
    Unrecorded(String),
}

/// A host id from etcd, fit to appear in a message: quoted and escaped
/// when it holds a character a name may not (etcd's data is not trusted).
pub fn shown(host: &str) -> String {
    crate::memfs::fence::shown(host)
}
