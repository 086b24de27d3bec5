//! The log on disk: append a batch of records under the lock, with one
//! `fdatasync`; learn the chain's tail from the file (another appender, or
//! a crash, may have moved it); note a torn last line; roll over past a size.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

pub use super::chain::rotated;
use super::error::AuditError;
use super::record::{self, Entry, GENESIS};
use super::summary::Pos;
use super::tracker::Tracker;
use crate::paths::Home;

/// Past this size the log rolls over (`MINI_LETTA_AUDIT_ROTATE_BYTES`).
pub const ROTATE_BYTES: u64 = 64 * 1024 * 1024;
/// How much of a file's end is read to find its last record (records are
/// far shorter: fields are clipped).
const TAIL_WINDOW: u64 = 256 * 1024;

/// The chain's end: the last record's number and the sha256 of its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    pub seq: u64,
    pub head: [u8; 32],
}

impl Tail {
    pub const START: Tail = Tail {
        seq: 0,
        head: GENESIS,
    };
}

/// A record as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    /// The sha256 (hex) of its line: the head once it is the last.
    pub head: String,
}

/// A last line a crash left without its newline, and the record that notes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornNote {
    pub after_seq: u64,
    pub bytes: u64,
    pub sha256: String,
    pub noted_by: u64,
}

/// What the file held when this appender last wrote it.
#[derive(Debug, Clone, Copy)]
struct Known {
    dev: u64,
    ino: u64,
    size: u64,
    tail: Tail,
}

/// One appender of a home's log (the supervisor's writer thread, or a CLI
/// command recording a policy change).
pub struct Writer {
    home: Home,
    lock: File,
    file: Option<File>,
    known: Option<Known>,
    rotate_at: u64,
    /// Keep the usage summary (the supervisor's writer).
    track_usage: bool,
    usage: Option<Tracker>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> AuditError + '_ {
    move |source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Make the audit directory (root's, 0700) if it is missing.
pub(crate) fn ensure_dir(home: &Home) -> Result<PathBuf, AuditError> {
    let dir = home.audit_dir();
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
    {
        Ok(()) => {}
        Err(e) => return Err(io(&dir)(e)),
    }
    // An older or hand-made directory gets the same mode.
    let meta = std::fs::symlink_metadata(&dir).map_err(io(&dir))?;
    if !meta.is_dir() {
        return Err(AuditError::Corrupt {
            path: dir,
            detail: "is not a directory".into(),
        });
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(io(&dir))?;
    }
    Ok(dir)
}

impl Writer {
    pub fn open(home: &Home) -> Result<Writer, AuditError> {
        ensure_dir(home)?;
        let lock_path = home.audit_lock();
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        let rotate_at = std::env::var("MINI_LETTA_AUDIT_ROTATE_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0)
            .unwrap_or(ROTATE_BYTES);
        Ok(Writer {
            home: home.clone(),
            lock,
            file: None,
            known: None,
            rotate_at,
            track_usage: false,
            usage: None,
        })
    }

    /// Roll over past `bytes` instead (tests; the variable sets it too).
    pub fn rotate_at(mut self, bytes: u64) -> Self {
        self.rotate_at = bytes.max(1);
        self
    }

    /// Keep the usage summary as records are appended (one appender does:
    /// the supervisor's).
    pub fn track_usage(mut self) -> Self {
        self.track_usage = true;
        self
    }

    /// Save the usage summary now, if it moved (a flush, a clean stop).
    pub fn save_usage(&mut self) {
        if let Some(t) = self.usage.as_mut() {
            t.save(&self.home);
        }
    }

    /// Bring the usage summary to the log's end (another appender, or
    /// none yet read). A failure costs the summary, never the append.
    fn catch_up_usage(&mut self) {
        if !self.track_usage {
            return;
        }
        let result = match self.usage.as_mut() {
            Some(t) => t.catch_up(&self.home),
            None => Tracker::open(&self.home).map(|t| self.usage = Some(t)),
        };
        if let Err(e) = result {
            tracing::warn!("the usage summary is not kept for now: {e}");
            self.usage = None;
        }
    }

    /// Account lines just written at `base` of the current file.
    fn track_written(&mut self, torn: Option<(u64, &[u8])>, base: u64, out: &[u8]) {
        let Some(t) = self.usage.as_mut() else {
            return;
        };
        if let Some((offset, line)) = torn {
            t.add(Pos { file: 0, offset }, line);
        }
        let mut at = 0;
        while let Some(nl) = out[at..].iter().position(|&b| b == b'\n') {
            // The newline ending a torn line is not a line of its own.
            if !(at == 0 && nl == 0 && torn.is_some()) {
                t.add(
                    Pos {
                        file: 0,
                        offset: base + at as u64,
                    },
                    &out[at..at + nl],
                );
            }
            at += nl + 1;
        }
        if t.due() {
            t.save(&self.home);
        }
    }

    /// Look at the tail now (at start): a torn last line is noted with a
    /// `torn` record. Returns the note when there was one.
    pub fn recover(&mut self) -> Result<Option<TornNote>, AuditError> {
        let (_, torn) = self.locked(&[])?;
        Ok(torn)
    }

    /// Append `entries` in order, durably (one `fdatasync`), and return
    /// each one's number and hash.
    pub fn append(&mut self, entries: &[Entry]) -> Result<Vec<Appended>, AuditError> {
        let (appended, torn) = self.locked(entries)?;
        if let Some(t) = torn {
            tracing::warn!(
                after_seq = t.after_seq,
                bytes = t.bytes,
                noted_by = t.noted_by,
                "the audit log ended in a torn line (a crash while appending); kept and noted"
            );
        }
        Ok(appended)
    }

    /// Under the lock: bring the tail up to date, note a torn line, roll
    /// over if due, write `entries`, sync.
    fn locked(
        &mut self,
        entries: &[Entry],
    ) -> Result<(Vec<Appended>, Option<TornNote>), AuditError> {
        let lock_path = self.home.audit_lock();
        let guard = flock(&self.lock).map_err(io(&lock_path))?;
        let path = self.home.audit_log();
        self.reopen_if_moved(&path)?;
        let Some(file) = self.file.as_mut() else {
            return Err(AuditError::Closed);
        };
        let meta = file.metadata().map_err(io(&path))?;
        let (tail, torn_bytes) = match self.known {
            Some(k) if k.dev == meta.dev() && k.ino == meta.ino() && k.size == meta.len() => {
                (k.tail, None)
            }
            _ => {
                let found = read_tail(&self.home, file, &path, meta.len())?;
                self.catch_up_usage();
                found
            }
        };
        let mut out = Vec::new();
        let mut tail = tail;
        let mut note = None;
        let mut base = meta.len();
        if let Some(torn) = &torn_bytes {
            // Ends the torn line, then says what it held: never dropped.
            out.push(b'\n');
            let sha = record::hex(&record::line_hash(torn));
            let entry = Entry::new("torn", None, Some("supervisor"))
                .with("torn_bytes", torn.len() as u64)
                .with("torn_sha256", sha.clone())
                .with(
                    "note",
                    "the log's last line was cut short (a crash while appending); it is kept above this record",
                );
            let line = record::format_line(tail.seq + 1, &tail.head, &record::now(), &entry);
            note = Some(TornNote {
                after_seq: tail.seq,
                bytes: torn.len() as u64,
                sha256: sha,
                noted_by: tail.seq + 1,
            });
            tail = Tail {
                seq: tail.seq + 1,
                head: record::line_hash(&line),
            };
            out.extend_from_slice(&line);
            out.push(b'\n');
        } else if meta.len() >= self.rotate_at && !entries.is_empty() {
            self.rotate(&path)?;
            base = 0;
        }
        let time = record::now();
        let mut appended = Vec::with_capacity(entries.len());
        for entry in entries {
            let line = record::format_line(tail.seq + 1, &tail.head, &time, entry);
            tail = Tail {
                seq: tail.seq + 1,
                head: record::line_hash(&line),
            };
            appended.push(Appended {
                seq: tail.seq,
                head: record::hex(&tail.head),
            });
            out.extend_from_slice(&line);
            out.push(b'\n');
        }
        let Some(file) = self.file.as_mut() else {
            return Err(AuditError::Closed);
        };
        if !out.is_empty() {
            file.write_all(&out).map_err(io(&path))?;
            file.sync_data().map_err(io(&path))?;
        }
        let torn_at = torn_bytes
            .as_deref()
            .map(|t| (base.saturating_sub(t.len() as u64), t));
        self.track_written(torn_at, base, &out);
        let Some(file) = self.file.as_mut() else {
            return Err(AuditError::Closed);
        };
        let meta = file.metadata().map_err(io(&path))?;
        self.known = Some(Known {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            tail,
        });
        drop(guard);
        Ok((appended, note))
    }

    /// Open the log (again) when it is not open or was replaced or rolled
    /// over by another appender.
    fn reopen_if_moved(&mut self, path: &Path) -> Result<(), AuditError> {
        let current = match std::fs::symlink_metadata(path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(path)(e)),
        };
        let same = match (&self.file, &current) {
            (Some(f), Some(m)) => f
                .metadata()
                .map(|o| o.dev() == m.dev() && o.ino() == m.ino())
                .unwrap_or(false),
            _ => false,
        };
        if !same {
            self.file = Some(open_log(path)?);
            self.known = None;
        }
        Ok(())
    }

    /// Roll `audit.jsonl` over to the next `audit-<n>.jsonl`; the new file
    /// continues the chain (its first `prev` is the old file's head).
    fn rotate(&mut self, path: &Path) -> Result<(), AuditError> {
        let next = rotated(&self.home)?.last().map_or(1, |(n, _)| n + 1);
        let target = self.home.audit_rotated(next);
        std::fs::rename(path, &target).map_err(io(&target))?;
        let file = open_log(path)?;
        let dir = self.home.audit_dir();
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&dir))?;
        tracing::info!(to = %target.display(), "the audit log rolled over");
        if let Some(t) = self.usage.as_mut() {
            t.rotated(next);
            t.save(&self.home);
        }
        let tail = self.known.map(|k| k.tail);
        self.file = Some(file);
        // The tail is unchanged: the empty file continues from it.
        self.known = tail.and_then(|tail| {
            let m = self.file.as_ref()?.metadata().ok()?;
            Some(Known {
                dev: m.dev(),
                ino: m.ino(),
                size: 0,
                tail,
            })
        });
        Ok(())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.save_usage();
    }
}

fn open_log(path: &Path) -> Result<File, AuditError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .mode(0o600)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(path)
        .map_err(io(path))
}

fn flock(file: &File) -> std::io::Result<FlockGuard> {
    use nix::fcntl::{Flock, FlockArg};
    // A second descriptor of the same open file: the lock is the file's.
    let mut file = file.try_clone()?;
    loop {
        match Flock::lock(file, FlockArg::LockExclusive) {
            Ok(held) => return Ok(held),
            Err((f, nix::errno::Errno::EINTR)) => file = f,
            Err((_, e)) => return Err(e.into()),
        }
    }
}

/// Held until dropped (nix's `Flock` unlocks then).
type FlockGuard = nix::fcntl::Flock<File>;

/// The chain's tail as the current file (else the newest rolled-over one)
/// holds it, and the bytes of a torn last line when there is one.
fn read_tail(
    home: &Home,
    file: &mut File,
    path: &Path,
    size: u64,
) -> Result<(Tail, Option<Vec<u8>>), AuditError> {
    let (last, torn) = last_line(file, path, size)?;
    let tail = match last {
        Some(line) => tail_of_line(path, &line)?,
        None => previous_file_tail(home)?,
    };
    Ok((tail, torn))
}

fn tail_of_line(path: &Path, line: &[u8]) -> Result<Tail, AuditError> {
    let (seq, _) = record::header(line).ok_or_else(|| AuditError::Corrupt {
        path: path.to_path_buf(),
        detail: "its last line is not a record (run `mini-letta audit verify`)".into(),
    })?;
    Ok(Tail {
        seq,
        head: record::line_hash(line),
    })
}

/// The tail of the newest rolled-over file (the current one is empty).
fn previous_file_tail(home: &Home) -> Result<Tail, AuditError> {
    let Some((_, path)) = rotated(home)?.pop() else {
        return Ok(Tail::START);
    };
    let mut f = File::open(&path).map_err(io(&path))?;
    let size = f.metadata().map_err(io(&path))?.len();
    match last_line(&mut f, &path, size)? {
        (Some(line), None) => tail_of_line(&path, &line),
        (None, None) => Ok(Tail::START),
        (_, Some(_)) => Err(AuditError::Corrupt {
            path,
            detail: "a rolled-over file ends in a torn line".into(),
        }),
    }
}

/// A file's last complete line, and the torn line after it, if any.
pub type LastLine = (Option<Vec<u8>>, Option<Vec<u8>>);

/// The last complete line of a file and, when the file does not end in a
/// newline, what follows it (a torn line).
pub(crate) fn last_line(file: &mut File, path: &Path, size: u64) -> Result<LastLine, AuditError> {
    if size == 0 {
        return Ok((None, None));
    }
    let start = size.saturating_sub(TAIL_WINDOW);
    file.seek(SeekFrom::Start(start)).map_err(io(path))?;
    let mut buf = Vec::with_capacity((size - start) as usize);
    file.take(size - start)
        .read_to_end(&mut buf)
        .map_err(io(path))?;
    let too_long = || AuditError::Corrupt {
        path: path.to_path_buf(),
        detail: format!("its last line is longer than {TAIL_WINDOW} bytes"),
    };
    let (complete, torn) = match buf.iter().rposition(|&b| b == b'\n') {
        Some(nl) if nl + 1 == buf.len() => (&buf[..nl], None),
        Some(nl) => (&buf[..nl], Some(buf[nl + 1..].to_vec())),
        None if start == 0 => return Ok((None, Some(buf))),
        None => return Err(too_long()),
    };
    let line = match complete.iter().rposition(|&b| b == b'\n') {
        Some(nl) => complete[nl + 1..].to_vec(),
        None if start == 0 => complete.to_vec(),
        None => return Err(too_long()),
    };
    Ok((Some(line), torn))
}
