//! Agents: their records and conversations on disk, and the runtime (turn
//! loop, tools, prompt cache) that runs inside the confined agent child.

pub mod archive;
pub mod cache;
pub mod context;
pub mod conversation;
pub mod index;
pub mod prompt_cache;
pub mod record;
pub mod reminders;
pub mod runtime;
pub mod skills;
pub mod store;
pub mod subagent;
pub mod tools;
