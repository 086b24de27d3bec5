//! The ground every other part of mini-letta stands on: where things are
//! on disk ([`paths`]), which characters a name may hold and the ids things
//! are made with ([`names`]), the one retry policy ([`retry`]), time as text
//! ([`clock`]),
//! descriptor-based access to the directories a child can write
//! ([`agentfs`]), atomic writes and bounded locks ([`fsutil`]), the wire
//! every process speaks ([`protocol`]) and a program's standard streams
//! ([`console`]). Nothing here runs a process of the design or knows an
//! agent's data.

pub mod agentfs;
pub mod clock;
pub mod console;
pub mod fsutil;
pub mod names;
pub mod paths;
pub mod protocol;
pub mod retry;
