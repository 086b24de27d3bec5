//! Confinement of every child: per-agent uids, namespaces (bubblewrap run
//! without capabilities), landlock, seccomp, no_new_privs, rlimits and
//! cgroups, layered so that each holds where another is missing, with the
//! level reached reported honestly ([`report`]) and strict mode failing
//! closed. The stage every confined child starts with is [`child`] (the
//! `mini-letta-stage2` program): it links this crate and the core only.
//!
//! What the sandbox reads of the rest of mini-letta is the core: paths,
//! the wire, descriptor-based file access and the retry policy.

use mini_letta_core::{agentfs, paths, protocol, retry};

pub mod cgroup;
pub mod child;
pub mod egress_stage;
pub mod identity;
pub mod namespaces;
pub mod plan;
pub mod probes;
pub mod proc_tree;
pub mod profile;
pub mod report;
pub mod report_cache;
pub mod seccomp;
pub mod shared_uid;
pub mod stage2;
pub mod subids;
pub mod sys;
pub mod volume;

/// Exit code when the child stage itself fails (not the program), and
/// when the launcher fails before `exec`.
pub const STAGE_FAILURE: i32 = 125;
