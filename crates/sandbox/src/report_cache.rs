//! The sandbox probe of a supervisor started for one command: the probe
//! runs processes (a uid switch, a set of new namespaces) and costs a few
//! milliseconds, more than the rest of such a start; a recent probe of the
//! same boot, kernel, program and settings is reused from the home's
//! private run directory.
//!
//! Why reuse cannot weaken a child: the report only says which layers the
//! plan asks for, and the stage refuses to run a child whose planned layer
//! cannot be applied — a layer that went away since the probe fails the
//! child, it never runs it with less. A layer that appeared since is used
//! from the next fresh probe: a daemon's start always probes afresh (and
//! keeps it), as do `sandbox status` and `doctor`, and a kept probe is
//! reused for [`MAX_AGE`] at most.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::report::{DISABLE_ENV, NAMESPACES_ENV, SandboxReport};
use crate::paths::Home;

/// How long a probe is reused.
pub const MAX_AGE: Duration = Duration::from_secs(600);

/// What a probe's answer depends on besides the hardware.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ProbeKey {
    boot_id: String,
    kernel: String,
    euid: u32,
    /// This program (device, inode, size, mtime): a new build probes anew.
    program: (u64, u64, u64, i64),
    disable: Option<String>,
    namespaces: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Cached {
    key: ProbeKey,
    /// Seconds since the epoch when it was probed.
    at: u64,
    report: SandboxReport,
}

impl ProbeKey {
    fn now() -> Option<ProbeKey> {
        use std::os::unix::fs::MetadataExt;
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let uname = nix::sys::utsname::uname().ok()?;
        let exe = std::fs::metadata(std::env::current_exe().ok()?).ok()?;
        Some(ProbeKey {
            boot_id: boot_id.trim().to_string(),
            kernel: format!(
                "{} {}",
                uname.release().to_string_lossy(),
                uname.version().to_string_lossy()
            ),
            euid: nix::unistd::geteuid().as_raw(),
            program: (exe.dev(), exe.ino(), exe.size(), exe.mtime()),
            disable: std::env::var(DISABLE_ENV).ok(),
            namespaces: std::env::var(NAMESPACES_ENV).ok(),
        })
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A probe of this host: the home's recent one when it still applies,
/// else a fresh one (then kept for the next).
pub fn probe_reusing(home: &Home) -> SandboxReport {
    let path = home.sandbox_report_cache();
    let key = ProbeKey::now();
    if let Some(key) = &key
        && let Some(report) = read(&path, key)
    {
        return report;
    }
    let report = SandboxReport::probe();
    if let Some(key) = key {
        keep(&path, key, &report);
    }
    report
}

/// A fresh probe, kept for the supervisors started for one command.
pub fn probe_fresh(home: &Home) -> SandboxReport {
    let report = SandboxReport::probe();
    if let Some(key) = ProbeKey::now() {
        keep(&home.sandbox_report_cache(), key, &report);
    }
    report
}

/// The kept probe, when it is ours (a regular file of this uid that no one
/// else may write, opened without following links), for this key and
/// recent.
fn read(path: &Path, key: &ProbeKey) -> Option<SandboxReport> {
    let dir = crate::agentfs::Dir::open(path.parent()?).ok()?;
    let (bytes, st) = dir.read_file_capped(path.file_name()?, 1 << 20).ok()?;
    if st.uid != key.euid || st.perm & 0o022 != 0 {
        return None;
    }
    let cached: Cached = serde_json::from_slice(&bytes).ok()?;
    let age = now_secs().checked_sub(cached.at)?;
    (cached.key == *key && age < MAX_AGE.as_secs()).then_some(cached.report)
}

/// Keep a probe: replaced whole, private to its owner, not flushed (it is
/// only ever a shortcut: a lost one is probed again).
fn keep(path: &Path, key: ProbeKey, report: &SandboxReport) {
    let Some(dir) = path.parent() else { return };
    let Ok(dir) = crate::agentfs::Dir::open(dir) else {
        return;
    };
    let cached = Cached {
        key,
        at: now_secs(),
        report: report.clone(),
    };
    let Ok(bytes) = serde_json::to_vec(&cached) else {
        return;
    };
    let name = path.file_name().unwrap_or_default();
    if let Err(e) = dir.replace_file_unsynced(name, &bytes, 0o600) {
        tracing::debug!("cannot keep the sandbox probe: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_probe_is_reused_only_for_its_key_while_recent_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        std::fs::create_dir_all(home.run_dir()).unwrap();
        let path = home.sandbox_report_cache();
        let key = ProbeKey::now().unwrap();
        let mut report = SandboxReport::probe();
        report.backend = "kept".into();
        keep(&path, key.clone(), &report);
        assert_eq!(read(&path, &key).unwrap().backend, "kept");
        assert_eq!(probe_reusing(&home).backend, "kept");
        // Another key (a setting changed): not reused.
        let other = ProbeKey {
            disable: Some("landlock".into()),
            ..key.clone()
        };
        assert!(read(&path, &other).is_none());
        // Too old: not reused.
        let mut old: Cached = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        old.at = now_secs() - MAX_AGE.as_secs() - 1;
        std::fs::write(&path, serde_json::to_vec(&old).unwrap()).unwrap();
        assert!(read(&path, &key).is_none());
        // Writable by others: not trusted.
        keep(&path, key.clone(), &report);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read(&path, &key).is_none());
        // A link where it goes: not followed.
        keep(&path, key.clone(), &report);
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert!(read(&path, &key).is_none());
        std::fs::remove_file(&path).unwrap();
        // A fresh probe replaces it.
        assert_ne!(probe_fresh(&home).backend, "kept");
        assert_ne!(read(&path, &key).unwrap().backend, "kept");
    }
}
