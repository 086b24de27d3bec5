//! The control key: where a supervisor's confined children share its uid
//! and see the host's paths (an ordinary user whose kernel refuses user
//! namespaces), its control socket is reachable from inside a sandbox and
//! the peer's uid no longer tells the operator from a child. A control
//! connection then proves itself with a key in the supervisor's private
//! run directory, which no child's landlock rules let it read.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use crate::paths::Home;
use crate::sandbox::report::SandboxReport;

/// What a refused control connection is told.
pub const REFUSAL: &str = "connection refused: this supervisor's children can reach its socket, \
so a control connection must present the key in its run directory (control.key), which the \
mini-letta CLI reads as the supervisor's user";

/// The key control connections must present, if any.
#[derive(Debug, Default)]
pub struct ControlKey(Option<String>);

impl ControlKey {
    /// Whether a hello presenting `key` is let in.
    pub fn admits(&self, key: Option<&str>) -> bool {
        match (&self.0, key) {
            (None, _) => true,
            (Some(want), Some(got)) => same(want.as_bytes(), got.as_bytes()),
            (Some(_), None) => false,
        }
    }
}

/// Whether children of a supervisor with `report` could connect to its
/// socket: they run as its uid (no agent uids) and no mount namespace
/// hides the home from them.
pub fn needed(report: &SandboxReport) -> bool {
    !report.uid_switch.available && !report.namespaces.available
}

/// Write a fresh key for this supervisor, before its socket is bound (so
/// that any connection it accepts read this key, not a predecessor's).
/// Always written, so that a CLI never has to guess whether to send one.
pub fn issue(home: &Home) -> std::io::Result<String> {
    let key = format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    );
    let path = home.control_key_file();
    let tmp = path.with_extension("key.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(key.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(key)
}

impl ControlKey {
    /// What control connections must present: `key` where [`needed`].
    pub(crate) fn for_host(key: String, report: &SandboxReport) -> Self {
        Self(needed(report).then_some(key))
    }
}

/// Compare without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_required_key_admits_only_itself() {
        let k = ControlKey(Some("abc".into()));
        assert!(k.admits(Some("abc")));
        assert!(!k.admits(Some("abd")));
        assert!(!k.admits(Some("ab")));
        assert!(!k.admits(None));
        assert!(ControlKey(None).admits(None));
    }
}
