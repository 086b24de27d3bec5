//! Log records written whole. The daemon's stdout and stderr are one
//! `O_APPEND` file (`supervisor.log`), and several threads log at once: a
//! record written in pieces could be split by another writer's. Each record
//! is gathered in memory and handed to the kernel in one `write(2)` (another
//! only if the kernel took part of it), so on an `O_APPEND` file records
//! never interleave.

//!
//! At default verbosity (no `-v`, no `RUST_LOG`) a command's stderr carries
//! only the program's own messages: once the process runs an embedded
//! supervisor, log records — a child that failed as expected, a reflection
//! that will be retried — go to the home's `supervisor.log`, where the
//! daemon's go ([`divert_quiet_records`]). `-v` and `RUST_LOG` keep them on
//! stderr.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use tracing_subscriber::fmt::MakeWriter;

/// Whether nobody asked to see log records (set by `init_logging`).
static QUIET: AtomicBool = AtomicBool::new(false);
/// Where records go instead of stderr, once diverted.
static SINK: RwLock<Option<Arc<File>>> = RwLock::new(None);

/// Say that this process's user asked for no log records on stderr.
pub(crate) fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// When records are unwanted on stderr, send them to `log` (appended,
/// private) from now on. Best effort: if the file cannot be opened they
/// stay on stderr rather than vanish.
pub fn divert_quiet_records(log: &Path) {
    if !QUIET.load(Ordering::Relaxed) {
        return;
    }
    let opened = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log);
    if let (Ok(file), Ok(mut sink)) = (opened, SINK.write()) {
        *sink = Some(Arc::new(file));
    }
}

/// Where quiet records go once the first one is written, for a process
/// that may never run a supervisor (a `memory` or `prompt` command):
/// nothing is created unless something is logged.
static LATER: RwLock<Option<std::path::PathBuf>> = RwLock::new(None);

/// [`divert_quiet_records`] at the first record, not now.
pub fn divert_quiet_records_lazily(log: &Path) {
    if !QUIET.load(Ordering::Relaxed) {
        return;
    }
    if let Ok(mut later) = LATER.write() {
        *later = Some(log.to_path_buf());
    }
}

/// The diverted log, opened now if it was named for later.
fn sink() -> Option<Arc<File>> {
    if let Some(file) = SINK.read().ok().and_then(|s| s.clone()) {
        return Some(file);
    }
    let later = LATER.write().ok().and_then(|mut l| l.take())?;
    if let Some(dir) = later.parent() {
        // The run directory is private, as the supervisor makes it.
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir);
    }
    divert_quiet_records(&later);
    SINK.read().ok().and_then(|s| s.clone())
}

/// Make a [`Record`] per log event, written to stderr (or the diverted
/// log) when it ends.
#[derive(Debug, Clone, Copy, Default)]
pub struct WholeRecords;

impl<'a> MakeWriter<'a> for WholeRecords {
    type Writer = Record<Target>;

    fn make_writer(&'a self) -> Self::Writer {
        match sink() {
            // A file is read later, by tools and by people: never colour.
            Some(file) => Record::new(Target::File(file)).plain(),
            None => Record::new(Target::Stderr(std::io::stderr())),
        }
    }
}

/// Where one record goes.
pub enum Target {
    Stderr(std::io::Stderr),
    File(Arc<File>),
}

impl AsFd for Target {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Target::Stderr(e) => e.as_fd(),
            Target::File(f) => f.as_fd(),
        }
    }
}

/// One log record, buffered; written whole to its target when dropped (or
/// flushed).
pub struct Record<T: AsFd> {
    target: T,
    buf: Vec<u8>,
    /// Terminal escape sequences are removed before writing.
    plain: bool,
}

impl<T: AsFd> Record<T> {
    pub fn new(target: T) -> Self {
        Record {
            target,
            buf: Vec::with_capacity(256),
            plain: false,
        }
    }

    /// Write without terminal escape sequences (the formatter may have
    /// been set up for a terminal before its records were diverted).
    pub fn plain(mut self) -> Self {
        self.plain = true;
        self
    }

    fn emit(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if self.plain && self.buf.contains(&0x1b) {
            self.buf = strip_escapes(&self.buf);
        }
        let result = write_whole(self.target.as_fd(), &self.buf);
        self.buf.clear();
        result
    }
}

/// `bytes` without CSI sequences (`ESC [ … final`) or other escape
/// sequences (`ESC`, intermediates, final).
fn strip_escapes(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != 0x1b {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        i += 1;
        if bytes.get(i) == Some(&b'[') {
            i += 1;
            // Parameters and intermediates, then one final byte 0x40–0x7e.
            while i < bytes.len() && !(0x40..=0x7e).contains(&bytes[i]) {
                i += 1;
            }
        } else {
            // `ESC ( B` and the like: intermediates, then the final byte.
            while i < bytes.len() && (0x20..=0x2f).contains(&bytes[i]) {
                i += 1;
            }
        }
        i += 1;
    }
    out
}

/// Write `bytes` with as few `write(2)` calls as the kernel allows (one,
/// unless it takes part), retrying on `EINTR`.
fn write_whole(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match nix::unistd::write(fd, bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = bytes.get(n..).unwrap_or_default(),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl<T: AsFd> Write for Record<T> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    /// The formatter flushes once, at the end of a record.
    fn flush(&mut self) -> std::io::Result<()> {
        self.emit()
    }
}

impl<T: AsFd> Drop for Record<T> {
    fn drop(&mut self) {
        // Nowhere to report a failed log write.
        let _ = self.emit();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Two writers (two open file descriptions, as two processes have)
    /// appending records in many small pieces at once, as a formatter does:
    /// every line of the file is one whole record.
    #[test]
    fn concurrent_appenders_write_only_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("supervisor.log");
        const RECORDS: usize = 400;
        let writers: Vec<_> = ["alpha", "omega"]
            .into_iter()
            .map(|who| {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .unwrap();
                std::thread::spawn(move || {
                    for i in 0..RECORDS {
                        let mut r = Record::new(&file);
                        // A record in pieces: level, fields, message, end.
                        write!(r, "INFO ").unwrap();
                        for piece in 0..20 {
                            write!(r, "{who}{piece}=").unwrap();
                            r.write_all(who.repeat(3).as_bytes()).unwrap();
                            r.write_all(b" ").unwrap();
                        }
                        writeln!(r, "record={who}#{i} end").unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2 * RECORDS);
        for line in lines {
            let who = if line.contains("alpha0=") {
                "alpha"
            } else {
                "omega"
            };
            let other = if who == "alpha" { "omega" } else { "alpha" };
            assert!(line.starts_with("INFO "), "{line}");
            assert!(line.ends_with(" end"), "{line}");
            assert!(!line.contains(other), "interleaved: {line}");
            assert_eq!(line.matches('=').count(), 21, "{line}");
        }
    }

    /// Issue 48 (15): a terminal user's embedded supervisor diverted its
    /// coloured records into supervisor.log.
    #[test]
    fn a_plain_record_loses_its_colour_and_keeps_its_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("supervisor.log");
        let file = std::fs::File::create(&path).unwrap();
        let mut r = Record::new(&file).plain();
        r.write_all(
            b"\x1b[2m2026\x1b[0m \x1b[33m WARN\x1b[0m \x1b[2mmini_letta\x1b[0m: done \x1b(B!\n",
        )
        .unwrap();
        drop(r);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "2026  WARN mini_letta: done !\n"
        );
    }

    #[test]
    fn a_record_is_written_once_on_flush_and_not_again_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let file = std::fs::File::create(&path).unwrap();
        let mut r = Record::new(&file);
        r.write_all(b"one line\n").unwrap();
        r.flush().unwrap();
        drop(r);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one line\n");
    }
}
