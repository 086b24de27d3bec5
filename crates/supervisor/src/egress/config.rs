//! The `[network]` table of `config.toml`: the default list new agents
//! get, the ranges no name may lead to, and the proxy's limits. Unknown
//! keys are errors (a typo would silently widen or empty a list).
//!
//! ```toml
//! [network]
//! allow = ["pypi.org", "files.pythonhosted.org"]   # new agents' list (default: none)
//! deny_cidrs = ["169.254.0.0/16", "fe80::/10"]     # replaces the default ranges
//! max_connections = 64          # per agent at once
//! max_bytes = 1073741824        # per connection, both ways together
//! idle_timeout_secs = 60        # a connection with no byte either way is closed
//! request_timeout_secs = 10     # the request head must arrive within this
//! ```
//!
//! Read again for every connection, so a change takes effect at once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::EgressError;
use super::allow::AllowList;
use super::cidr::{self, Cidr};
use crate::paths::Home;

/// Per-agent connections at once, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Bytes one connection may carry (both ways), by default: 1 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// Idle time after which a connection is closed, by default.
pub const DEFAULT_IDLE_SECS: u64 = 60;
/// Time a client has to send its request head, by default.
pub const DEFAULT_REQUEST_SECS: u64 = 10;

/// The effective `[network]` settings.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// The list a new agent gets.
    pub allow: AllowList,
    /// Ranges no connection may reach.
    pub deny: Vec<Cidr>,
    pub max_connections: usize,
    pub max_bytes: u64,
    pub idle_timeout: Duration,
    pub request_timeout: Duration,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        Self {
            allow: AllowList::default(),
            deny: cidr::default_deny(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_bytes: DEFAULT_MAX_BYTES,
            idle_timeout: Duration::from_secs(DEFAULT_IDLE_SECS),
            request_timeout: Duration::from_secs(DEFAULT_REQUEST_SECS),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct File {
    #[serde(default)]
    network: Option<Section>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    allow: Option<Vec<String>>,
    deny_cidrs: Option<Vec<String>>,
    max_connections: Option<usize>,
    max_bytes: Option<u64>,
    idle_timeout_secs: Option<u64>,
    request_timeout_secs: Option<u64>,
}

impl NetworkConfig {
    /// `[network]` of the home's `config.toml` (defaults when the file or
    /// the table is absent).
    pub fn load(home: &Home) -> Result<Self, EgressError> {
        Self::load_from(&home.config_file())
    }

    pub fn load_from(path: &Path) -> Result<Self, EgressError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => {
                return Err(EgressError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Self, EgressError> {
        let invalid = |message: String| EgressError::Config {
            path: PathBuf::from(path),
            message,
        };
        let file: File =
            toml::from_str(text).map_err(|e| invalid(e.message().trim().replace('\n', " ")))?;
        let Some(s) = file.network else {
            return Ok(Self::default());
        };
        let d = Self::default();
        let allow = AllowList::parse(&s.allow.unwrap_or_default())
            .map_err(|e| invalid(format!("allow: {e}")))?;
        let deny = match s.deny_cidrs {
            None => d.deny,
            Some(list) => list
                .iter()
                .map(|c| Cidr::parse(c))
                .collect::<Result<_, _>>()
                .map_err(|e| invalid(format!("deny_cidrs: {e}")))?,
        };
        let positive = |name: &str, v: Option<u64>, default: u64| match v {
            Some(0) => Err(invalid(format!("{name} must be greater than 0"))),
            Some(v) => Ok(v),
            None => Ok(default),
        };
        let max_connections = positive(
            "max_connections",
            s.max_connections.map(|v| v as u64),
            d.max_connections as u64,
        )?;
        Ok(Self {
            allow,
            deny,
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            max_bytes: positive("max_bytes", s.max_bytes, d.max_bytes)?,
            idle_timeout: Duration::from_secs(positive(
                "idle_timeout_secs",
                s.idle_timeout_secs,
                DEFAULT_IDLE_SECS,
            )?),
            request_timeout: Duration::from_secs(positive(
                "request_timeout_secs",
                s.request_timeout_secs,
                DEFAULT_REQUEST_SECS,
            )?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NetworkConfig, EgressError> {
        NetworkConfig::parse(Path::new("config.toml"), text)
    }

    #[test]
    fn network_table_is_read_and_checked() {
        let d = parse("[model]\ndefault = \"mock\"\n").unwrap();
        assert!(d.allow.is_empty());
        assert_eq!(d.deny.len(), cidr::DEFAULT_DENY.len());
        let c = parse(
            "[network]\nallow = [\"pypi.org\"]\ndeny_cidrs = [\"10.0.0.0/8\"]\nmax_connections = 3\nidle_timeout_secs = 2\n",
        )
        .unwrap();
        assert_eq!(c.allow.to_strings(), ["pypi.org"]);
        assert_eq!(c.deny.len(), 1);
        assert_eq!(c.max_connections, 3);
        assert_eq!(c.idle_timeout, Duration::from_secs(2));
        for bad in [
            "[network]\nalow = []\n",
            "[network]\nallow = [\"*\"]\n",
            "[network]\ndeny_cidrs = [\"10/8\"]\n",
            "[network]\nmax_connections = 0\n",
            "[network]\nallow = \"pypi.org\"\n",
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("[network]"), "{e}");
        }
    }
}
