//! A supervisor's hold on the cluster: the configuration read at start,
//! the node once it joined, and one ownership gate per agent. Kept apart
//! from the supervisor's code so its shared state can hold it without
//! importing what uses it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::config::ClusterConfig;
use super::node::Node;

/// The supervisor's cluster: its configuration and, once started, its node.
#[derive(Default)]
pub struct Handle {
    config: Option<ClusterConfig>,
    node: OnceLock<Arc<Node>>,
    /// One ownership check per agent at a time: a second turn waits for
    /// the first one's take-over instead of running on memory not yet
    /// brought to the remote's.
    gates: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Handle {
    /// A handle for `config` (`None`: no cluster, everything passes).
    pub fn new(config: Option<ClusterConfig>) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The agent's ownership gate.
    pub(crate) fn gate(&self, agent: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.entry(agent.to_string()).or_default().clone()
    }

    pub fn node(&self) -> Option<&Arc<Node>> {
        self.node.get()
    }

    /// Set the node once it joined (a second call is ignored).
    pub fn joined(&self, node: Arc<Node>) {
        let _ = self.node.set(node);
    }

    pub fn config(&self) -> Option<&ClusterConfig> {
        self.config.as_ref()
    }

    pub fn enabled(&self) -> bool {
        self.config.is_some()
    }
}
