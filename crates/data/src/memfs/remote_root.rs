//! What a remote root (`MINI_LETTA_REMOTE_ROOT`) names, decided once for
//! every spelling (issue 43).
//!
//! Why one parse: the checks a directory root gets ([`crate::memfs::remote_repo`])
//! must not depend on how the operator spelled it. A `file://` URL is a
//! directory on this host and gets exactly those checks (git would follow
//! a symlink there into another tenant's repository); a network URL goes to
//! the git CLI; anything git would read as an option (`-…`), as a transport
//! that runs a program (`fd::`, `ext::`, any `<helper>::`), or through a
//! scheme we do not allow is refused before git starts. The rules follow
//! git's own (`transport.c`, `connect.c`): a scheme is `[A-Za-z][A-Za-z0-9+.-]*`,
//! `X::address` is a remote helper, `[user@]host:path` with the colon
//! before any slash is ssh, anything else is a path.

use std::path::{Path, PathBuf};

use crate::paths::REMOTE_REPO_SUFFIX;

/// Schemes a network root may use; git reaches each through its own
/// transport, none of which runs a program named by the URL.
pub const NETWORK_SCHEMES: [&str; 6] = ["ssh", "git+ssh", "ssh+git", "git", "http", "https"];

/// A remote root, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteRoot {
    /// A directory on this host (a path, or a `file://` URL), absolute.
    Dir(PathBuf),
    /// A network URL (one of [`NETWORK_SCHEMES`], or scp-like `host:path`).
    Network(String),
}

/// A remote root refused before anything reads it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refusing the remote root {shown}: {reason}")]
pub struct RootRefused {
    /// The root as written, quoted, control characters escaped.
    pub shown: String,
    pub reason: String,
}

impl RemoteRoot {
    /// Classify `root` (see the module docs).
    pub fn parse(root: &str) -> Result<Self, RootRefused> {
        let refuse = |reason: &str| RootRefused {
            shown: format!("{:?}", root.chars().take(200).collect::<String>()),
            reason: reason.to_string(),
        };
        if root.trim().is_empty() {
            return Err(refuse("it is empty"));
        }
        if root.chars().any(char::is_control) {
            return Err(refuse("it holds a control character"));
        }
        if root.starts_with('-') {
            return Err(refuse("git would read it as an option"));
        }
        let scheme_len = scheme_len(root);
        let rest = &root[scheme_len..];
        if scheme_len > 0 && rest.starts_with("::") {
            return Err(refuse(
                "it names a git remote helper (`helper::address`), which runs a program; \
                 use a path, file://, ssh, git, http or https",
            ));
        }
        if scheme_len > 0
            && let Some(after) = rest.strip_prefix("://")
        {
            let scheme = root[..scheme_len].to_ascii_lowercase();
            if scheme == "file" {
                return file_url(after).map(RemoteRoot::Dir).map_err(|r| refuse(&r));
            }
            if !NETWORK_SCHEMES.contains(&scheme.as_str()) {
                return Err(refuse(&format!(
                    "git would reach it through the {scheme:?} transport; allowed are a path, \
                     file://, {}",
                    NETWORK_SCHEMES.join(", ")
                )));
            }
            return network_host_ok(host_of(after.split('/').next().unwrap_or("")))
                .map(|()| RemoteRoot::Network(root.to_string()))
                .map_err(|r| refuse(&r));
        }
        if let Some(host) = scp_host(root) {
            return network_host_ok(host_of(host))
                .map(|()| RemoteRoot::Network(root.to_string()))
                .map_err(|r| refuse(&r));
        }
        // The CLI, a daemon and every host read the same variable from
        // different working directories: a relative root names a different
        // directory for each (and `--upload-pack=…:x` would be one).
        if !root.starts_with('/') {
            return Err(refuse(
                "it is a relative path, which names another directory for every process \
                 that syncs; give an absolute path or a file:// URL",
            ));
        }
        Ok(RemoteRoot::Dir(PathBuf::from(root)))
    }

    /// Where agent `agent_id`'s repository is under this root, unchecked
    /// (a directory's still needs [`crate::memfs::remote_repo::check`]).
    pub(crate) fn agent_location(&self, agent_id: &str) -> String {
        match self {
            RemoteRoot::Dir(dir) => dir
                .join(format!("{agent_id}{REMOTE_REPO_SUFFIX}"))
                .to_string_lossy()
                .into_owned(),
            RemoteRoot::Network(url) => {
                format!(
                    "{}/{agent_id}{REMOTE_REPO_SUFFIX}",
                    url.trim_end_matches('/')
                )
            }
        }
    }

    /// The directory, for a root on this host.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            RemoteRoot::Dir(d) => Some(d),
            RemoteRoot::Network(_) => None,
        }
    }
}

/// Length of a URL scheme at the start of `s` (git's `is_urlschemechar`:
/// a letter, then letters, digits, `+`, `-`, `.`), 0 when there is none.
fn scheme_len(s: &str) -> usize {
    let mut n = 0;
    for (i, c) in s.char_indices() {
        let ok = if i == 0 {
            c.is_ascii_alphabetic()
        } else {
            c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')
        };
        if !ok {
            break;
        }
        n = i + c.len_utf8();
    }
    n
}

/// The path a `file://` URL's remainder (after `file://`) names: the host
/// must be empty or `localhost`, the path absolute once `%XX` is decoded.
fn file_url(after: &str) -> Result<PathBuf, String> {
    let (host, path) = match after.find('/') {
        Some(at) => after.split_at(at),
        None => (after, ""),
    };
    if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
        return Err(format!(
            "a file URL names the host {host:?}; only this host's files can be reached that way"
        ));
    }
    if path.is_empty() {
        return Err("a file URL needs an absolute path".into());
    }
    let decoded = percent_encoding::percent_decode_str(path).collect::<Vec<u8>>();
    if decoded.contains(&0) || decoded.iter().any(|b| b.is_ascii_control()) {
        return Err("its path holds a control character".into());
    }
    use std::os::unix::ffi::OsStringExt;
    Ok(PathBuf::from(std::ffi::OsString::from_vec(decoded)))
}

/// The host part of an scp-like root (`[user@]host:path`, the colon
/// before any slash), `None` for a path.
fn scp_host(root: &str) -> Option<&str> {
    let colon = root.find(':')?;
    match root.find('/') {
        Some(slash) if slash < colon => None,
        _ => Some(&root[..colon]),
    }
}

/// `host[:port]` without a `user@` before it (brackets of an IPv6 literal kept).
fn host_of(authority: &str) -> &str {
    authority.rsplit_once('@').map_or(authority, |(_, h)| h)
}

/// A host ssh would not read as an option and that names something.
fn network_host_ok(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("it names no host".into());
    }
    if host.starts_with('-') {
        return Err(format!(
            "its host {host:?} starts with '-', which ssh would read as an option"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn dir(s: &str) -> PathBuf {
        match RemoteRoot::parse(s).unwrap() {
            RemoteRoot::Dir(d) => d,
            other => panic!("{s}: {other:?}"),
        }
    }

    fn net(s: &str) -> bool {
        RemoteRoot::parse(s) == Ok(RemoteRoot::Network(s.to_string()))
    }

    #[test]
    fn paths_and_file_urls_are_one_directory() {
        assert_eq!(dir("/srv/mem"), PathBuf::from("/srv/mem"));
        assert_eq!(dir("file:///srv/mem"), PathBuf::from("/srv/mem"));
        assert_eq!(dir("FILE://localhost/srv/mem"), PathBuf::from("/srv/mem"));
        assert_eq!(dir("file:///srv/a%20b"), PathBuf::from("/srv/a b"));
        // A colon after a slash is a path, as git reads it.
        assert_eq!(dir("/srv/a:b"), PathBuf::from("/srv/a:b"));
        assert_eq!(dir("/tmp/x://y"), PathBuf::from("/tmp/x://y"));
    }

    #[test]
    fn network_urls_pass_as_written() {
        for s in [
            "ssh://git@example.com/mem",
            "git+ssh://example.com/mem",
            "https://git.example.com/mem/",
            "http://127.0.0.1:8080/mem",
            "git://example.com/mem",
            "git@example.com:mem",
            "example.com:mem",
        ] {
            assert!(net(s), "{s}");
        }
    }

    #[test]
    fn options_helpers_and_odd_schemes_are_refused_saying_why() {
        for (s, why) in [
            ("--upload-pack=touch /tmp/x:y", "option"),
            ("-oProxyCommand=x", "option"),
            ("fd::3", "remote helper"),
            ("ext::sh -c x", "remote helper"),
            ("persistent-https::x", "remote helper"),
            ("ssh://-oProxyCommand=x/y", "starts with '-'"),
            ("git@-oProxyCommand=x:y", "starts with '-'"),
            ("gopher://example.com/x", "\"gopher\" transport"),
            ("file://example.com/srv", "names the host"),
            ("file://", "absolute path"),
            ("file:///srv/%00x", "control character"),
            ("/srv/\u{1b}[2Jmem", "control character"),
            ("ssh://", "no host"),
            ("relative/dir", "relative path"),
            ("./a:b", "relative path"),
            ("  ", "empty"),
        ] {
            let e = RemoteRoot::parse(s).unwrap_err();
            assert!(e.reason.contains(why), "{s}: {e}");
            assert!(!e.to_string().contains('\u{1b}'), "{e}");
        }
    }

    #[test]
    fn agent_locations() {
        let at = |root: &str| RemoteRoot::parse(root).unwrap().agent_location("ag-1");
        assert_eq!(at("/srv/mem/"), "/srv/mem/ag-1.git");
        assert_eq!(at("file:///srv/mem"), "/srv/mem/ag-1.git");
        assert_eq!(at("https://h/mem/"), "https://h/mem/ag-1.git");
        assert_eq!(at("git@h:mem"), "git@h:mem/ag-1.git");
    }
}
