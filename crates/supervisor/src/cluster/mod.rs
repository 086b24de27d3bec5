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
//! | `/mini-letta/epoch-base` | decimal, added to take revisions for fence epochs | none |

pub mod config;
mod error;
pub mod events;
pub mod handle;
mod keys;
pub mod node;
pub mod recover;
pub mod status;

pub use config::ClusterConfig;
pub use events::{Change, OwnerChange, Recorder};
pub use handle::Handle;
pub use node::{Node, Owned};

pub use error::ClusterError;
pub use keys::{
    EPOCH_BASE_KEY, MAX_EPOCH, PREFIX, agent_from_etcd, host_from_etcd, host_key, member_key,
    owner_key, parse_epoch, untrusted,
};
