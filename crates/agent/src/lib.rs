//! The program inside a confined agent child (`mini-letta-agent`): its
//! commands, the turn loop, the tools, context and compaction, reminders
//! and a sub-agent's loop. It knows the supervisor only as the far end of
//! the protocol and the model providers not at all: this crate cannot
//! depend on `mini-letta-model`, nor on the supervisor above it.

use mini_letta_core::{clock, console, paths, protocol, retry};
use mini_letta_data::{memfs, recall, store};
use mini_letta_sandbox as sandbox;

pub mod agent;
