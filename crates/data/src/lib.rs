//! The agents' data and its memory: each agent's memory repository
//! ([`memfs`]: commits, the validator, the compiler, worktrees, merges,
//! sync), its records, name index, conversations and archives ([`store`]),
//! search over what was said ([`recall`]) and the sub-agents' library
//! ([`reflection`]: settings, payloads, locks, queues, outcomes, prompts).
//! Libraries only: nothing here runs a program of the design. Within the
//! crate the map still rules (`memfs` never names the store outside its
//! tests; `tests/layout.rs`).

use mini_letta_core::{agentfs, clock, fsutil, names, paths, protocol, retry};
use mini_letta_sandbox as sandbox;

pub mod memfs;
pub mod recall;
pub mod reflection;
pub mod store;
