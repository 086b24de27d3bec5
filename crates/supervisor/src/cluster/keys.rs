//! The keys this program writes in etcd, and how values read back from
//! it are taken: checked, and shown only briefly and visibly.

/// Every key this program writes starts here.
pub const PREFIX: &str = "/mini-letta/";

/// The cluster's epoch base: added to every take's revision to make the
/// fence epoch (issue 43 §3). Absent means 0; `cluster recover` raises it
/// past every fence in the remote after etcd lost its data (its revisions
/// start again from 1, below the epochs the remote's fences carry).
pub const EPOCH_BASE_KEY: &str = "/mini-letta/epoch-base";

/// The largest epoch mini-letta issues (the fence's rule).
pub use crate::memfs::fence::MAX_EPOCH;

/// An epoch written as decimal text, if it is a plausible one.
pub fn parse_epoch(bytes: &[u8]) -> Option<i64> {
    let n: i64 = std::str::from_utf8(bytes).ok()?.trim().parse().ok()?;
    (0..=MAX_EPOCH).contains(&n).then_some(n)
}

/// The key naming `agent`'s owner.
pub fn owner_key(agent: &str) -> String {
    format!("{PREFIX}agents/{agent}/owner")
}

/// The leased key saying `host` is alive.
pub fn host_key(host: &str) -> String {
    format!("{PREFIX}hosts/{host}")
}

/// The lasting key saying `host` was a member once.
pub fn member_key(host: &str) -> String {
    format!("{PREFIX}members/{host}")
}

/// The most characters of an untrusted value a message or a row quotes.
const SHOWN_CHARS: usize = 40;

/// A host id as etcd holds it (an owner key's value, a host key's name):
/// `Ok` when it is one a host could be configured with
/// ([`super::config::check_host_id`]); otherwise `Err` with a brief visible form
/// of it. etcd's data is not trusted: none of it reaches a terminal, a
/// page or a message raw or at length, and a value that is no host id is
/// never reported as one.
pub fn host_from_etcd(bytes: &[u8]) -> Result<String, String> {
    match std::str::from_utf8(bytes) {
        Ok(s) if super::config::check_host_id(s).is_ok() => Ok(s.to_string()),
        _ => Err(format!("(invalid host id {})", untrusted(bytes))),
    }
}

/// An agent id as an etcd key holds it: `Ok` when it is one
/// ([`crate::paths::is_valid_agent_id`]), else `Err` with a brief visible
/// form.
pub fn agent_from_etcd(bytes: &[u8]) -> Result<String, String> {
    match std::str::from_utf8(bytes) {
        Ok(s) if crate::paths::is_valid_agent_id(s) => Ok(s.to_string()),
        _ => Err(format!("(invalid agent id {})", untrusted(bytes))),
    }
}

/// `bytes` from etcd, briefly and visibly: quoted, its first characters
/// with every control or unsafe one escaped (bytes that are not UTF-8
/// become U+FFFD), and its length when that is not all of it.
pub fn untrusted(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN_CHARS * 4)]);
    let mut out = String::from("\"");
    let mut shown = 0;
    for c in text.chars().take(SHOWN_CHARS) {
        if c.is_control() || crate::names::is_unsafe(c) || c == '"' || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        shown += c.len_utf8();
    }
    out.push('"');
    if shown < bytes.len() || text.contains('\u{fffd}') {
        out.push_str(&format!("… ({} bytes)", bytes.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn values_from_etcd_are_host_ids_or_brief_visible_text() {
        assert_eq!(host_from_etcd(b"host-a"), Ok("host-a".to_string()));
        let huge = vec![b'H'; 1 << 20];
        let e = host_from_etcd(&huge).unwrap_err();
        assert!(e.len() < 120 && e.contains("1048576 bytes"), "{e}");
        let e = host_from_etcd(b"a\x1b[2J\x07\xff\xfe").unwrap_err();
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert!(e.contains("\\u{1b}") && e.contains("(8 bytes)"), "{e}");
        let e = host_from_etcd("a\u{202e}b".as_bytes()).unwrap_err();
        assert!(!e.contains('\u{202e}'), "{e}");
        assert!(host_from_etcd(b"a/b").is_err());
        assert!(host_from_etcd(b"").is_err());
        assert!(agent_from_etcd(b"../../etc").is_err());
    }
}
