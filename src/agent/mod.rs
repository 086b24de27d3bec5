//! Agents: their records on disk and (in later modules) their runtime.

pub mod cache;
pub mod conversation;
pub mod prompt_cache;
pub mod record;
pub mod runtime;
pub mod store;
pub mod tools;
