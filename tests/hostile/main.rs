//! Attacks on what root later reads: data a hostile agent, archive or
//! remote plants, and the readers (import, git, the operator's terminal,
//! Palace, sync) that must not trust it. One module per attack surface;
//! each test is the attack, written before its fix.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod audit;
mod cluster;
#[path = "../common/mod.rs"]
mod common;
mod egress;
mod egress_world;
mod frames;
mod import;
mod leftovers;
mod live_repo;
mod palace_readers;
mod planted;
mod recovery;
mod remote_root;
mod subagents;
mod sync;
mod terminal;
mod timings;
mod warm;
