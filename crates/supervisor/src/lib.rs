//! The root supervisor and what only it runs: the sockets, the child table,
//! turns, sub-agents, leases and the model proxy ([`supervisor`]); network
//! egress for tool commands ([`egress`]); several hosts under one etcd
//! ([`cluster`]); agents on a shared remote ([`remote`]). The CLI, Palace,
//! doctor and verify sit above it (the `mini-letta` crate) and it never
//! names them: the compiler keeps that rule.

use mini_letta_agent_program::agent;
use mini_letta_audit as audit;
use mini_letta_core::{clock, console, fsutil, names, paths, protocol, retry};
use mini_letta_data::{memfs, reflection, store};
use mini_letta_model as model;
use mini_letta_sandbox as sandbox;

pub mod cluster;
pub mod egress;
pub mod remote;
pub mod supervisor;
