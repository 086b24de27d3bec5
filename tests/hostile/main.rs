//! Attacks on what root later reads: data a hostile agent, archive or
//! remote plants, and the readers (import, git, the operator's terminal,
//! Palace, sync) that must not trust it. One module per attack surface;
//! each test is the attack, written before its fix.

#[path = "../common/mod.rs"]
#[allow(dead_code)]
mod common;
