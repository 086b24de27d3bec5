//! Why a clustered operation could not go ahead.

/// Why a clustered operation could not go ahead.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
    #[error("invalid cluster configuration: {0}")]
    Config(String),
    /// This host's id is registered under another lease (another live
    /// supervisor, this host's previous one until its lease expires, or a
    /// key written by hand): says which.
    #[error("{0}")]
    HostIdInUse(String),
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
