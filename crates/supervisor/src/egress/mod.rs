//! Network egress for tool commands (issue 34): a confined command reaches
//! the network only through the supervisor's proxy, only to the hosts its
//! agent's allow-list names, and every attempt is recorded.
//!
//! The path, for a child whose role profile says `network = "proxy"` (the
//! agent, whose Bash tool runs commands, and `tool`):
//! 1. the child keeps its own network namespace, with no route out; its
//!    stage tells the supervisor (descriptor 4, [`stage`]) once it is in it;
//! 2. the supervisor enters that namespace from a thread of its own
//!    ([`netns`]), brings `lo` up and listens on `127.0.0.1:PORT` there —
//!    the endpoint is the supervisor's socket, not a relay in the sandbox;
//! 3. the child's environment names it in `HTTP_PROXY`, `HTTPS_PROXY`,
//!    `ALL_PROXY` and their lower-case forms; landlock lets it connect to
//!    that port only, seccomp lets it open TCP sockets only;
//! 4. each connection is one [`proxy::session`]: HTTP/1.1 absolute-form
//!    forwarding or a `CONNECT` tunnel, decided from the host and port as
//!    written against the agent's list ([`allow`], stored by [`policy`]),
//!    names resolved by the supervisor and refused when they lead into
//!    `[network] deny_cidrs` ([`cidr`], [`config`]);
//! 5. every attempt becomes one record of the agent's network log
//!    ([`log`]); refusals also go to the supervisor's log at warn.
//!
//! `docs/network.md` is the operator's account of it.

pub mod allow;
pub mod cidr;
pub mod config;
pub mod denials;
pub mod http;
pub mod log;
pub mod netns;
pub mod pace;
pub mod policy;
pub mod proxy;
mod relay;
pub mod resolver;
pub mod serve;
pub mod shared;

use std::path::PathBuf;

/// The proxy's port on every command's own loopback (the child stage's
/// side of the path owns it: `sandbox::egress_stage`).
pub use crate::sandbox::egress_stage::PORT;

/// The variables that name the proxy, upper- and lower-case (programs
/// differ on which they read; curl reads only `http_proxy` for HTTP).
pub const PROXY_VARIABLES: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// The proxy's URL as the variables give it.
pub(crate) fn proxy_url() -> String {
    format!("http://127.0.0.1:{PORT}")
}

/// Why an egress file or setting could not be used.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("invalid configuration in {}: [network] {message}", path.display())]
    Config { path: PathBuf, message: String },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error(transparent)]
    Paths(#[from] crate::paths::PathsError),
}
