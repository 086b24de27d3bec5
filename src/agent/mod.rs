//! Agents: their records on disk and (in later modules) their runtime.

pub mod cache;
pub mod record;
pub mod store;
