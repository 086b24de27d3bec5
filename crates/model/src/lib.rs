//! Models: the [`Model`] trait and its providers. Providers run in the
//! supervisor only (it alone holds credentials and network); agent children
//! reach them through `model.complete` on their channel.
//!
//! * `mock` — deterministic and offline, the default: the book's rules
//!   (remember / forget / persona / rename), a scripted mode for tests,
//!   deterministic summaries and reflections, reported usage.
//! * `openai/<model>` — OpenAI-compatible Chat Completions (OpenAI, Ollama,
//!   vLLM, llama.cpp), streamed (SSE), with tool calls.
//! * `anthropic/<model>` — the Messages API, streamed, with tool use.

use mini_letta_core::{fsutil, paths, protocol};

mod answer;
pub mod anthropic;
pub mod config;
pub mod factory;
mod http;
pub mod mock;
pub mod openai;
mod provider;
pub mod scripted;
mod sse;
pub mod windows;

pub use crate::protocol::messages::{
    Message, ModelFailure, ModelRequest, ModelResponse, Part, Purpose, Role, StopKind, ToolSpec,
    Usage,
};
pub use config::{ConfigError, ProviderConfig, default_model};
pub use factory::open_model;
pub use provider::{Model, ModelError, ModelEvent};
