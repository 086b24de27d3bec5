//! Cluster configuration: `MINI_LETTA_ETCD`, `MINI_LETTA_HOST_ID`,
//! `MINI_LETTA_LEASE_SECS`, or `[cluster]` in `<home>/config.toml` (the
//! environment wins):
//!
//! ```toml
//! [cluster]
//! etcd = ["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"]
//! host_id = "host-a"     # default: the host name
//! lease_secs = 10        # default
//! ```
//!
//! Without any etcd endpoint there is no cluster and nothing changes.
//! Unknown keys in `[cluster]` are refused (a typo must not silently
//! leave a host unfenced).

use std::path::Path;

use serde::Deserialize;

use crate::paths::Home;

use super::error::ClusterError;

pub const ETCD_ENV: &str = "MINI_LETTA_ETCD";
pub const HOST_ID_ENV: &str = "MINI_LETTA_HOST_ID";
pub const LEASE_SECS_ENV: &str = "MINI_LETTA_LEASE_SECS";

/// How long a host's lease lasts without a keep-alive.
pub const DEFAULT_LEASE_SECS: u64 = 10;

/// etcd's own floor for a lease is about a second and a half of its
/// election timeout; below two seconds a pause of the keep-alive task
/// alone would cost ownership.
const MIN_LEASE_SECS: u64 = 2;
const MAX_LEASE_SECS: u64 = 3600;

/// A host id goes into etcd keys and fence commits.
const MAX_HOST_ID: usize = 64;

/// A clustered supervisor's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// etcd client URLs (`http://host:port`).
    pub endpoints: Vec<String>,
    pub host_id: String,
    pub lease_secs: u64,
}

#[derive(Debug, Default, Deserialize)]
struct FileConfig {
    #[serde(default)]
    cluster: Option<Section>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    #[serde(default)]
    etcd: Vec<String>,
    host_id: Option<String>,
    lease_secs: Option<u64>,
}

impl ClusterConfig {
    /// The home's cluster, or `None` when no etcd is configured.
    pub fn load(home: &Home) -> Result<Option<Self>, ClusterError> {
        Self::load_from(&home.config_file(), &|k| std::env::var(k).ok())
    }

    /// [`load`](Self::load) from `path` with `env` for the environment.
    pub fn load_from(
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, ClusterError> {
        let invalid = |m: String| ClusterError::Config(format!("{}: {m}", path.display()));
        let section = match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str::<FileConfig>(&text)
                .map_err(|e| invalid(format!("[cluster] {}", e.message().trim())))?
                .cluster
                .unwrap_or_default(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Section::default(),
            Err(e) => return Err(invalid(e.to_string())),
        };
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let endpoints: Vec<String> = match env(ETCD_ENV) {
            Some(list) => list
                .split(',')
                .map(|e| e.trim().to_string())
                .filter(|e| !e.is_empty())
                .collect(),
            None => section.etcd,
        };
        if endpoints.is_empty() {
            return Ok(None);
        }
        for e in &endpoints {
            check_endpoint(e).map_err(|m| ClusterError::Config(format!("etcd endpoint {m}")))?;
        }
        let host_id = match env(HOST_ID_ENV).or(section.host_id) {
            Some(h) => h.trim().to_string(),
            None => default_host_id()?,
        };
        check_host_id(&host_id).map_err(ClusterError::Config)?;
        let lease_secs = match env(LEASE_SECS_ENV) {
            Some(v) => v.trim().parse::<u64>().map_err(|_| {
                ClusterError::Config(format!("{LEASE_SECS_ENV}={v:?} is not a whole number"))
            })?,
            None => section.lease_secs.unwrap_or(DEFAULT_LEASE_SECS),
        };
        if !(MIN_LEASE_SECS..=MAX_LEASE_SECS).contains(&lease_secs) {
            return Err(ClusterError::Config(format!(
                "the lease must be {MIN_LEASE_SECS} to {MAX_LEASE_SECS} seconds, not {lease_secs}"
            )));
        }
        Ok(Some(Self {
            endpoints,
            host_id,
            lease_secs,
        }))
    }
}

/// `Err(why)` for an endpoint this build cannot reach (TLS is not built in).
fn check_endpoint(e: &str) -> Result<(), String> {
    let rest = e
        .strip_prefix("http://")
        .ok_or_else(|| format!("{e:?} must start with http:// (TLS is not built in)"))?;
    if rest.is_empty() || rest.contains(char::is_whitespace) {
        return Err(format!("{e:?} names no host"));
    }
    Ok(())
}

/// `Err(why)` for a host id that cannot be a key component or be shown.
pub(crate) fn check_host_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_HOST_ID {
        return Err(format!(
            "the host id must be 1 to {MAX_HOST_ID} bytes, not {}",
            id.len()
        ));
    }
    crate::names::check(id).map_err(|e| format!("the host id {id:?}: {e}"))?;
    if id.contains('/') || id.chars().any(char::is_whitespace) {
        return Err(format!(
            "the host id {id:?} may hold neither '/' nor white space"
        ));
    }
    Ok(())
}

fn default_host_id() -> Result<String, ClusterError> {
    // The kernel's own (what `hostname` prints), without a libc call.
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .ok_or_else(|| {
            ClusterError::Config(format!(
                "cannot read the host name: set {HOST_ID_ENV} or [cluster] host_id"
            ))
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn load(file: &str, env: &[(&str, &str)]) -> Result<Option<ClusterConfig>, ClusterError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, file).unwrap();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ClusterConfig::load_from(&path, &|k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn nothing_configured_is_no_cluster() {
        assert_eq!(load("", &[]).unwrap(), None);
        assert_eq!(load("[model]\ndefault = \"mock\"\n", &[]).unwrap(), None);
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        let file =
            "[cluster]\netcd = [\"http://10.0.0.1:2379\"]\nhost_id = \"file\"\nlease_secs = 30\n";
        let c = load(file, &[]).unwrap().unwrap();
        assert_eq!(c.endpoints, vec!["http://10.0.0.1:2379"]);
        assert_eq!((c.host_id.as_str(), c.lease_secs), ("file", 30));
        let c = load(
            file,
            &[
                (ETCD_ENV, "http://a:1, http://b:2"),
                (HOST_ID_ENV, "env"),
                (LEASE_SECS_ENV, "5"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoints, vec!["http://a:1", "http://b:2"]);
        assert_eq!((c.host_id.as_str(), c.lease_secs), ("env", 5));
        let c = load("", &[(ETCD_ENV, "http://a:1")]).unwrap().unwrap();
        assert_eq!(c.lease_secs, DEFAULT_LEASE_SECS);
        assert!(!c.host_id.is_empty());
    }

    #[test]
    fn typos_and_bad_values_are_refused() {
        for (file, env, says) in [
            (
                "[cluster]\netc = [\"http://a:1\"]\n",
                vec![],
                "unknown field",
            ),
            ("", vec![(ETCD_ENV, "https://a:1")], "TLS"),
            ("", vec![(ETCD_ENV, "a:1")], "http://"),
            (
                "",
                vec![(ETCD_ENV, "http://a:1"), (LEASE_SECS_ENV, "1")],
                "2 to 3600",
            ),
            (
                "",
                vec![(ETCD_ENV, "http://a:1"), (LEASE_SECS_ENV, "ten")],
                "whole number",
            ),
            (
                "",
                vec![(ETCD_ENV, "http://a:1"), (HOST_ID_ENV, "a/b")],
                "'/'",
            ),
            (
                "",
                vec![(ETCD_ENV, "http://a:1"), (HOST_ID_ENV, "a\u{1b}[31m")],
                "host id",
            ),
        ] {
            let e = load(file, &env).unwrap_err().to_string();
            assert!(e.contains(says), "{file:?} {env:?}: {e}");
        }
    }
}
