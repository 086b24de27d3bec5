//! mini-letta: stateful AI agents whose long-term memory is a git repository
//! of Markdown files, run under a supervisor that confines every agent process.

pub mod agent;
pub mod agentfs;
pub mod audit;
pub mod child;
pub mod cli;
pub mod cluster;
pub mod console;
pub mod doctor;
pub mod egress;
pub mod fsutil;
pub mod memfs;
pub mod model;
pub mod names;
pub mod palace;
pub mod paths;
pub mod protocol;
pub mod recall;
pub mod reflection;
pub mod remote;
pub mod reports;
pub mod retry;
pub mod sandbox;
pub mod store;
pub mod supervisor;
pub mod verify;
