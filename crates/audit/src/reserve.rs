//! The audit log's disk reserve: a child's action is refused while the
//! filesystem holding the log has less free space than the reserve, so
//! the disk never fills under the log. What has already happened (a
//! child's exit, a supervisor's start, a torn line's note, the operator's
//! own changes) may still be written into the reserve; nothing a child
//! asks for may.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::kind;

/// The reserve: this much, or a tenth of a smaller filesystem.
pub const RESERVE_BYTES: u64 = 16 << 20;
/// A free-space reading is reused this long (a flood of appends costs one
/// `statvfs` per interval).
const READING_TTL: Duration = Duration::from_millis(250);

/// Kinds written whatever the free space: records of what already
/// happened, which refusing would only lose.
const INTO_THE_RESERVE: &[&str] = &[
    kind::EXIT,
    kind::START,
    kind::TORN,
    kind::CONFIG,
    kind::OWNER,
];

/// Free bytes, and the reserve, of the filesystem holding `dir`.
pub fn reading(dir: &Path) -> Option<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    let frag = st.fragment_size();
    let free = st.blocks_available().saturating_mul(frag);
    let size = st.blocks().saturating_mul(frag);
    Some((free, RESERVE_BYTES.min(size / 10)))
}

/// [`reading`] for `home`'s audit log (its home's filesystem before the
/// log's directory exists).
pub fn of_home(home: &crate::paths::Home) -> Option<(u64, u64)> {
    let dir = home.audit_dir();
    reading(if dir.exists() { &dir } else { home.root() })
}

/// Why a record of `kind` may not be appended now: the disk under `dir`
/// is down to its reserve.
pub fn check(dir: &Path, kind: &str) -> Result<(), (u64, u64)> {
    if INTO_THE_RESERVE.contains(&kind) {
        return Ok(());
    }
    type Cache = Mutex<Option<(Instant, std::path::PathBuf, (u64, u64))>>;
    static LAST: Cache = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let fresh = last
        .as_ref()
        .filter(|(at, d, _)| at.elapsed() < READING_TTL && d == dir)
        .map(|(_, _, r)| *r);
    let (free, reserve) = match fresh.or_else(|| reading(dir)) {
        Some(r) => {
            *last = Some((Instant::now(), dir.to_path_buf(), r));
            r
        }
        // Unreadable: nothing to judge by, so no refusal on a guess.
        None => return Ok(()),
    };
    if free < reserve {
        Err((free, reserve))
    } else {
        Ok(())
    }
}
