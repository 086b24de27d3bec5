//! The agent program: what runs inside the confined agent child (the turn
//! loop, tools, context and compaction, reminders, a sub-agent's step
//! loop). Its data lives in `crate::store`.

pub mod channel;
pub mod context;
pub mod program;
pub mod reminders;
pub mod runtime;
pub mod skills;
pub mod subagent_loop;
pub mod tools;
