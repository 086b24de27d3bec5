//! Where each agent's allow-list is kept: `<home>/network/<id>/allow.json`,
//! the operator's (0700 directory, 0600 file), outside `agents/`, so no
//! child sees or writes it and no imported archive carries one. The CLI
//! writes it; the supervisor reads it for every connection, so a change
//! (even `--none` while a command runs) applies to the next request.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::EgressError;
use super::allow::AllowList;
use super::config::NetworkConfig;
use crate::paths::Home;

/// A list file is a few entries; anything larger is not one of ours.
const MAX_FILE: u64 = 256 * 1024;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    allow: Vec<String>,
}

/// Agent `id`'s list; none stored is the empty list (no network).
pub fn read(home: &Home, id: &str) -> Result<AllowList, EgressError> {
    let path = home.network_allow_file(id)?;
    let Some(bytes) = read_small(&path)? else {
        return Ok(AllowList::default());
    };
    let invalid = |message: String| EgressError::Invalid {
        path: path.clone(),
        message,
    };
    let stored: Stored = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    AllowList::parse(&stored.allow).map_err(invalid)
}

/// Replace agent `id`'s list.
pub fn write(home: &Home, id: &str, list: &AllowList) -> Result<(), EgressError> {
    let path = home.network_allow_file(id)?;
    let dir = home.agent_network_dir(id)?;
    private_dirs(&home.network_dir(), &dir)?;
    let text = serde_json::to_vec_pretty(&Stored {
        allow: list.to_strings(),
    })
    .map_err(|e| EgressError::Invalid {
        path: path.clone(),
        message: e.to_string(),
    })?;
    crate::fsutil::atomic_write_mode(&path, &text, 0o600).map_err(|source| EgressError::Write {
        path: path.clone(),
        source,
    })?;
    // A policy change is a `config` record of the audit log before it is
    // acknowledged (the caller reports an error when it cannot be written).
    let mut fields = serde_json::Map::new();
    fields.insert("setting".into(), "network".into());
    fields.insert(
        "value".into(),
        serde_json::json!({ "allow": list.to_strings() }),
    );
    crate::audit::append(home, crate::audit::kind::CONFIG, Some(id), None, fields).map_err(
        |e| EgressError::Write {
            path: home.audit_log(),
            source: std::io::Error::other(e.to_string()),
        },
    )?;
    tracing::info!(agent = id, allow = ?list.to_strings(), "network allow-list set");
    Ok(())
}

/// Give a new agent the `[network] allow` list of `config.toml`, if any.
pub fn apply_default(home: &Home, id: &str, config: &NetworkConfig) -> Result<(), EgressError> {
    if config.allow.is_empty() {
        return Ok(());
    }
    write(home, id, &config.allow)
}

/// Remove agent `id`'s list and network log (the agent is deleted).
pub fn remove(home: &Home, id: &str) -> Result<(), EgressError> {
    let dir = home.agent_network_dir(id)?;
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(EgressError::Write {
            path: dir,
            source: e,
        }),
        _ => Ok(()),
    }
}

/// `network/` and the agent's directory in it, created 0700.
pub(super) fn private_dirs(network: &Path, dir: &Path) -> Result<(), EgressError> {
    for d in [network, dir] {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(EgressError::Write {
                    path: d.to_path_buf(),
                    source: e,
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// `path` opened for reading, never through a symlink (nor blocking on a
/// FIFO); `None` when it does not exist.
pub(super) fn open_no_follow(path: &Path) -> Result<Option<std::fs::File>, EgressError> {
    let err = |source: std::io::Error| EgressError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    Ok(Some(file))
}

/// A small regular file's bytes, never through a symlink; `None` when it
/// does not exist.
pub(super) fn read_small(path: &Path) -> Result<Option<Vec<u8>>, EgressError> {
    let err = |source: std::io::Error| EgressError::Read {
        path: path.to_path_buf(),
        source,
    };
    let Some(file) = open_no_follow(path)? else {
        return Ok(None);
    };
    let meta = file.metadata().map_err(err)?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        return Err(EgressError::Invalid {
            path: path.to_path_buf(),
            message: format!("not a regular file of at most {MAX_FILE} bytes"),
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE).read_to_end(&mut bytes).map_err(err)?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_round_trip_and_planted_links_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        let id = "agent-x";
        assert!(read(&home, id).unwrap().is_empty());
        let list = AllowList::parse(&["pypi.org", "*.github.com:443"]).unwrap();
        write(&home, id, &list).unwrap();
        assert_eq!(read(&home, id).unwrap(), list);
        let file = home.network_allow_file(id).unwrap();
        let mode = |p: &Path| {
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
                & 0o777
        };
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&home.agent_network_dir(id).unwrap()), 0o700);
        // A symlink where the list goes is not followed.
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(&elsewhere, r#"{"allow":["evil.example"]}"#).unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &file).unwrap();
        assert!(read(&home, id).is_err());
        // A file that is not a list is an error, not an empty list.
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, r#"{"allow":["*"]}"#).unwrap();
        assert!(read(&home, id).is_err());
        remove(&home, id).unwrap();
        assert!(!home.agent_network_dir(id).unwrap().exists());
        assert!(read(&home, "../x").is_err());
    }
}
