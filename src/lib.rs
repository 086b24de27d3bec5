//! mini-letta: stateful AI agents whose long-term memory is a git repository
//! of Markdown files, run under a supervisor that confines every agent process.
//!
//! The layers below live in crates of their own (the map in
//! `docs/architecture.md`); they are re-exported here under the names the
//! code has always used.

pub use mini_letta_agent_program::agent;
pub use mini_letta_audit as audit;
pub use mini_letta_core::{agentfs, clock, console, fsutil, names, paths, protocol, retry};
pub use mini_letta_data::{memfs, recall, reflection, store};
pub use mini_letta_model as model;
pub use mini_letta_sandbox as sandbox;
pub use mini_letta_sandbox::child;
pub use mini_letta_supervisor::{cluster, egress, remote, supervisor};

pub mod cli;
pub mod doctor;
pub mod palace;
pub mod reports;
pub mod verify;
