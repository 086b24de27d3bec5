//! Moving an agent between homes and hosts: `agent export` writes its
//! directory as a gzip-compressed tar archive, `agent import` checks such an
//! archive whole before anything of it is used, then unpacks it beside the
//! other agents and renames it into place.
//!
//! What travels:
//!
//! ```text
//! mini-letta-export.json   what this is (format, agent id and name, when)
//! agent.json               the record, without its sandbox uid (a uid belongs to a host)
//! memory/                  the working tree, as it is (its `.git` pointer is rebuilt)
//! memory.git/              HEAD, packed-refs, refs/, logs/, objects/ (full history)
//!                          and the layout policy; never hooks or config
//!                          (an import takes only loose objects, packs,
//!                          branches and refs/mini-letta/, see below)
//! conversations/           every conversation
//! ```
//!
//! Runtime leftovers (`tmp/`, `memory-worktrees/`, `reflections/`, lock
//! files, the ownership marker) stay behind. The export reads the agent's
//! directory through descriptors (`crate::agentfs`): the agent's own trees
//! are a confined child's to change, so nothing there is followed, and
//! symlinks, FIFOs, sockets, devices and hard-linked files are skipped with
//! a warning, never archived. The memory repository is read under its
//! writer lock, so the history exported is one a commit left complete.
//!
//! An import is refused, with nothing left in the home, unless every entry
//! is a regular file or a directory under a plain relative path (no `..`,
//! no absolute path, no link or device), the entries and their declared
//! sizes stay within [`Limits`], `agent.json` parses and names a valid id,
//! no agent present has that id or name, and the memory repository's
//! `HEAD` resolves, every object any kept ref reaches is in the archive's
//! own object store (read with alternates ignored: `repo::seal`), and
//! `HEAD`'s tree passes the validator. The git configuration, hooks and
//! index are made fresh, never taken from the archive; nor is anything
//! that would make the repository read beyond itself or rewrite what it
//! reads: `objects/info/*` (alternates, commit-graph), `info/grafts`,
//! `shallow`, refs outside `refs/heads/` and `refs/mini-letta/` (replace
//! refs, remote-tracking refs, tags), and their `packed-refs` lines.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::record::AgentRecord;
use crate::agentfs::{Dir, FsError, Kind};
use crate::memfs::compiler::iso_timestamp;
use crate::memfs::hook;
use crate::memfs::lock::RepoLock;
use crate::memfs::repo;
use crate::memfs::validate::{self, Policy, ValidateOptions};
use crate::paths::{
    AgentPaths, CONVERSATIONS_DIR_NAME, Home, IMPORT_STAGING_PREFIX, LAYOUT_POLICY_FILE_NAME,
    MEMORY_DIR_NAME, MEMORY_GIT_DIR_NAME, RECALL_DIR_NAME,
};
use crate::store::{self, StoreError};

/// Name of the manifest, the archive's first entry.
pub const MANIFEST_NAME: &str = "mini-letta-export.json";
/// The manifest's `format`.
pub const FORMAT: &str = "mini-letta-agent-export";
/// The manifest's `version`.
pub const FORMAT_VERSION: u32 = 1;

const RECORD_NAME: &str = "agent.json";
/// `agent.json` and the manifest are small; anything bigger is not ours.
const MAX_SMALL_FILE: u64 = 1 << 20;
/// `memory.git/HEAD` is one line.
const MAX_HEAD_BYTES: u64 = 4096;
/// Deepest path accepted (in components).
const MAX_DEPTH: usize = 64;
/// Longest path accepted (in bytes).
const MAX_PATH_BYTES: usize = 4096;
/// Entries of one directory read by the export.
const MAX_DIR_ENTRIES: usize = 200_000;
/// Largest single file the export reads (it is held in memory).
const MAX_EXPORT_FILE: u64 = 512 << 20;
/// Objects walked when checking an imported history.
const MAX_OBJECTS: usize = 10_000_000;
/// `memory.git/packed-refs` (one line per ref).
const MAX_PACKED_REFS: u64 = 64 << 20;

/// Bounds on an archive, checked on the entries' headers before their
/// contents are read, on export and on import alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries (files and directories).
    pub max_entries: u64,
    /// Bytes of all files together, uncompressed.
    pub max_total_bytes: u64,
}

impl Default for Limits {
    /// 200 000 entries, 4 GiB.
    fn default() -> Self {
        Limits {
            max_entries: 200_000,
            max_total_bytes: 4 << 30,
        }
    }
}

/// What the first entry says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub agent_id: String,
    pub name: String,
    pub exported_at: String,
    /// The mini-letta version that wrote it.
    pub mini_letta: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// (`file` is left out of the message: callers name the archive.)
    #[error("not a readable gzip-compressed tar archive: {source}")]
    Corrupt { file: PathBuf, source: io::Error },
    #[error("archive entry {entry:?}: {why}; refusing the archive")]
    BadEntry { entry: String, why: String },
    #[error("the archive has more than {max} entries; refusing it (a tar bomb?)")]
    TooManyEntries { max: u64 },
    #[error(
        "the archive's files add up to more than {max} bytes uncompressed; refusing it (a tar bomb?)"
    )]
    TooLarge { max: u64 },
    #[error("not a mini-letta agent export: {0}")]
    NotAnExport(String),
    #[error("the archive's agent.json is invalid: {0}")]
    BadRecord(String),
    #[error("the archive's agent names model {model:?}, which cannot be used: {why}")]
    BadModel { model: String, why: String },
    #[error(
        "an agent with id {id} already exists ({name}); an import keeps the agent's id, so \
         delete that agent first (`mini-letta agent delete`) to replace it"
    )]
    IdTaken { id: String, name: String },
    #[error("an agent named {0:?} already exists; import under another name with --name NEW_NAME")]
    NameTaken(String),
    #[error("the archive's memory repository is damaged: {0}")]
    BadRepository(String),
    #[error("the archive's memory does not pass the validator: {0}")]
    InvalidMemory(String),
    #[error("{path}: {why}")]
    Export { path: PathBuf, why: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    Repo(#[from] repo::RepoError),
    #[error(transparent)]
    Hook(#[from] hook::HookError),
    #[error(transparent)]
    Lock(#[from] crate::memfs::lock::LockError),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn bad_repo(e: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::BadRepository(e.to_string())
}

// ---------------------------------------------------------------- export

/// What an export wrote.
#[derive(Debug, Clone, Serialize)]
pub struct Exported {
    pub path: PathBuf,
    pub id: String,
    pub name: String,
    /// Entries archived (files and directories).
    pub entries: u64,
    /// Bytes of the files archived, uncompressed.
    pub bytes: u64,
    /// Paths left out, each with the reason (symlinks, special files).
    pub skipped: Vec<String>,
}

/// Write agent `selector`'s archive to `out`: a temporary file beside it,
/// renamed over `out` once complete, so `out` is never a partial archive.
pub fn export(home: &Home, selector: &str, out: &Path) -> Result<Exported, ArchiveError> {
    let (record, paths) = store::find(home, Some(selector))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| ArchiveError::Export {
            path: out.to_path_buf(),
            why: "not a file name".into(),
        })?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{file_name}."))
        .suffix(".tmp")
        .tempfile_in(&parent)
        .map_err(io_err(&parent))?;
    let gz = flate2::write::GzEncoder::new(
        io::BufWriter::new(tmp.as_file().try_clone().map_err(io_err(tmp.path()))?),
        flate2::Compression::default(),
    );
    let mut w = ExportWriter {
        tar: tar::Builder::new(gz),
        out: out.to_path_buf(),
        entries: 0,
        bytes: 0,
        skipped: Vec::new(),
        limits: Limits::default(),
    };

    let manifest = Manifest {
        format: FORMAT.into(),
        version: FORMAT_VERSION,
        agent_id: record.id.clone(),
        name: record.name.clone(),
        exported_at: iso_timestamp(OffsetDateTime::now_utc()),
        mini_letta: env!("CARGO_PKG_VERSION").into(),
    };
    let now = OffsetDateTime::now_utc().unix_timestamp();
    w.file(MANIFEST_NAME, &json_bytes(&manifest, out)?, 0o644, now)?;
    let mut portable = record.clone();
    portable.sandbox_uid = None;
    w.file(RECORD_NAME, &json_bytes(&portable, out)?, 0o644, now)?;

    let agent_dir = Dir::open(paths.dir())?;
    {
        // History first, under the writer lock: what is archived is what
        // some commit left complete.
        let _lock = RepoLock::acquire(&paths.memory_git_dir())?;
        let git = agent_dir.open_dir(MEMORY_GIT_DIR_NAME)?;
        w.dir(MEMORY_GIT_DIR_NAME, &git.stat()?)?;
        // Refs before objects: every object a ref names is already there.
        for name in [
            "HEAD",
            "packed-refs",
            LAYOUT_POLICY_FILE_NAME,
            "refs",
            "logs",
            "objects",
        ] {
            w.entry(
                &git,
                name,
                &format!("{MEMORY_GIT_DIR_NAME}/{name}"),
                false,
                1,
            )?;
        }
    }
    for top in [MEMORY_DIR_NAME, CONVERSATIONS_DIR_NAME] {
        w.entry(&agent_dir, top, top, true, 0)?;
    }

    let ExportWriter {
        tar,
        entries,
        bytes,
        skipped,
        ..
    } = w;
    let gz = tar.into_inner().map_err(io_err(out))?;
    let mut buf = gz.finish().map_err(io_err(out))?;
    buf.flush().map_err(io_err(out))?;
    drop(buf);
    tmp.as_file().sync_all().map_err(io_err(tmp.path()))?;
    tmp.as_file()
        .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io_err(tmp.path()))?;
    tmp.persist(out).map_err(|e| io_err(out)(e.error))?;
    if let Ok(d) = fs::File::open(&parent) {
        let _ = d.sync_all();
    }
    Ok(Exported {
        path: out.to_path_buf(),
        id: record.id,
        name: record.name,
        entries,
        bytes,
        skipped,
    })
}

fn json_bytes<T: Serialize>(value: &T, out: &Path) -> Result<Vec<u8>, ArchiveError> {
    let mut v = serde_json::to_vec_pretty(value).map_err(|e| ArchiveError::Export {
        path: out.to_path_buf(),
        why: e.to_string(),
    })?;
    v.push(b'\n');
    Ok(v)
}

struct ExportWriter<W: Write> {
    tar: tar::Builder<W>,
    out: PathBuf,
    entries: u64,
    bytes: u64,
    skipped: Vec<String>,
    limits: Limits,
}

impl<W: Write> ExportWriter<W> {
    fn count(&mut self, size: u64) -> Result<(), ArchiveError> {
        self.entries += 1;
        self.bytes = self.bytes.saturating_add(size);
        // An archive this one could not be imported from is not written.
        if self.entries > self.limits.max_entries {
            return Err(ArchiveError::TooManyEntries {
                max: self.limits.max_entries,
            });
        }
        if self.bytes > self.limits.max_total_bytes {
            return Err(ArchiveError::TooLarge {
                max: self.limits.max_total_bytes,
            });
        }
        Ok(())
    }

    fn append(
        &mut self,
        kind: tar::EntryType,
        path: &str,
        data: &[u8],
        mode: u32,
        mtime: i64,
    ) -> Result<(), ArchiveError> {
        self.count(data.len() as u64)?;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_mtime(u64::try_from(mtime).unwrap_or(0));
        h.set_uid(0);
        h.set_gid(0);
        self.tar
            .append_data(&mut h, path, data)
            .map_err(io_err(&self.out))
    }

    fn file(&mut self, path: &str, data: &[u8], perm: u32, mtime: i64) -> Result<(), ArchiveError> {
        let mode = if perm & 0o111 != 0 { 0o755 } else { 0o644 };
        self.append(tar::EntryType::Regular, path, data, mode, mtime)
    }

    fn dir(&mut self, path: &str, st: &crate::agentfs::Stat) -> Result<(), ArchiveError> {
        self.append(tar::EntryType::Directory, path, &[], 0o755, st.mtime.0)
    }

    fn skip(&mut self, path: &str, why: impl std::fmt::Display) {
        self.skipped.push(format!("{path}: {why}"));
    }

    /// Archive entry `name` of `dir` as `path` (and, for a directory,
    /// everything below it). `agent_owned`: a tree a confined child writes,
    /// where a hard-linked file is skipped too.
    fn entry(
        &mut self,
        dir: &Dir,
        name: &str,
        path: &str,
        agent_owned: bool,
        depth: usize,
    ) -> Result<(), ArchiveError> {
        // Lock files are runtime state, never content; the working tree's
        // `.git` pointer is rebuilt on import; the recall index is rebuilt
        // from the conversations by the first search.
        if name.ends_with(".lock")
            || (depth == 1 && agent_owned && name == ".git")
            || (depth == 1 && path == format!("{CONVERSATIONS_DIR_NAME}/{RECALL_DIR_NAME}"))
        {
            return Ok(());
        }
        if depth > MAX_DEPTH {
            return Err(ArchiveError::Export {
                path: dir.path().join(name),
                why: format!("more than {MAX_DEPTH} levels deep"),
            });
        }
        let Some(st) = dir.stat_at(name)? else {
            return Ok(()); // gone (or never there: packed-refs, logs)
        };
        match st.kind {
            Kind::Dir => {
                let sub = match dir.open_dir(name) {
                    Ok(d) => d,
                    Err(e @ (FsError::Symlink { .. } | FsError::NotADirectory { .. })) => {
                        self.skip(path, e);
                        return Ok(());
                    }
                    Err(e) => return Err(e.into()),
                };
                self.dir(path, &st)?;
                for child in sub.list(MAX_DIR_ENTRIES)? {
                    let Some(child) = child.to_str() else {
                        let shown = format!("{path}/{}", child.to_string_lossy());
                        self.skip(&shown, "name is not valid UTF-8; not exported");
                        continue;
                    };
                    self.entry(
                        &sub,
                        child,
                        &format!("{path}/{child}"),
                        agent_owned,
                        depth + 1,
                    )?;
                }
                Ok(())
            }
            Kind::File if agent_owned && st.nlink > 1 => {
                self.skip(path, format!("has {} hard links; not exported", st.nlink));
                Ok(())
            }
            Kind::File => match dir.read_file_capped(name, MAX_EXPORT_FILE) {
                Ok((bytes, st)) => self.file(path, &bytes, st.perm, st.mtime.0),
                Err(
                    e @ (FsError::Symlink { .. }
                    | FsError::NotRegular { .. }
                    | FsError::Changed { .. }),
                ) => {
                    self.skip(path, e);
                    Ok(())
                }
                Err(e) => Err(e.into()),
            },
            other => {
                self.skip(path, format!("{}; not exported", other.describe()));
                Ok(())
            }
        }
    }
}

// ---------------------------------------------------------------- import

/// Checks a record's model handle; the reason when it cannot be used.
pub type ModelCheck<'a> = &'a dyn Fn(&str) -> Result<(), String>;

/// How to import.
#[derive(Default)]
pub struct ImportOptions<'a> {
    /// The name the agent gets (its archived name when `None`).
    pub name: Option<String>,
    pub limits: Limits,
    /// Checks the record's model handle (the store knows no providers;
    /// the CLI passes `model::factory::parse_handle`).
    pub check_model: Option<ModelCheck<'a>>,
}

/// Where an archive entry goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    Manifest,
    Record,
    /// `memory.git/HEAD`: checked, then written over the fresh one.
    Head,
    /// `memory.git/packed-refs`: only the lines of kept refs are written.
    PackedRefs,
    /// Unpacked at this relative path.
    Keep(PathBuf),
    /// Not taken (rebuilt on import, or not ours to take).
    Skip,
}

/// Judge one entry by its header: type, path and where it goes.
fn classify(raw: &[u8], kind: tar::EntryType) -> Result<Place, ArchiveError> {
    let shown = String::from_utf8_lossy(raw).into_owned();
    let bad = |why: &str| ArchiveError::BadEntry {
        entry: shown.clone(),
        why: why.to_string(),
    };
    let is_dir = kind.is_dir();
    if !kind.is_file() && !is_dir {
        let what = match kind {
            tar::EntryType::Symlink => "a symbolic link",
            tar::EntryType::Link => "a hard link",
            tar::EntryType::Char => "a character device",
            tar::EntryType::Block => "a block device",
            tar::EntryType::Fifo => "a FIFO",
            _ => "not a regular file or directory",
        };
        return Err(bad(&format!(
            "is {what}; only regular files and directories are accepted"
        )));
    }
    let text = std::str::from_utf8(raw).map_err(|_| bad("path is not valid UTF-8"))?;
    if text.len() > MAX_PATH_BYTES {
        return Err(bad("path is too long"));
    }
    if text.starts_with('/') {
        return Err(bad("absolute path"));
    }
    let text = text.strip_prefix("./").unwrap_or(text);
    let text = if is_dir {
        text.trim_end_matches('/')
    } else {
        text
    };
    if text.is_empty() || text == "." {
        return if is_dir {
            Ok(Place::Skip)
        } else {
            Err(bad("empty path"))
        };
    }
    let parts: Vec<&str> = text.split('/').collect();
    if parts.contains(&"..") {
        return Err(bad("path contains `..`"));
    }
    if parts.iter().any(|p| p.is_empty() || *p == ".") {
        return Err(bad("path has empty or `.` components"));
    }
    if parts
        .iter()
        .any(|p| p.contains('\\') || p.chars().any(char::is_control))
    {
        return Err(bad("path has control characters or backslashes"));
    }
    if parts.len() > MAX_DEPTH {
        return Err(bad("path is too deep"));
    }
    let keep = || Ok(Place::Keep(parts.iter().collect()));
    let want_dir = |is: bool| {
        if is == is_dir {
            Ok(())
        } else if is {
            Err(bad("must be a directory"))
        } else {
            Err(bad("must be a regular file"))
        }
    };
    match parts.as_slice() {
        [MANIFEST_NAME] => want_dir(false).map(|()| Place::Manifest),
        [RECORD_NAME] => want_dir(false).map(|()| Place::Record),
        [MEMORY_DIR_NAME | CONVERSATIONS_DIR_NAME | MEMORY_GIT_DIR_NAME] => {
            want_dir(true).and_then(|()| keep())
        }
        // The working tree's `.git` pointer is rebuilt.
        [MEMORY_DIR_NAME, ".git", ..] => Ok(Place::Skip),
        [MEMORY_DIR_NAME | CONVERSATIONS_DIR_NAME, ..] => keep(),
        [MEMORY_GIT_DIR_NAME, rest @ ..] => match rest {
            // Stale lock files would stop the next commit.
            _ if parts.last().is_some_and(|l| l.ends_with(".lock")) => Ok(Place::Skip),
            ["HEAD"] => want_dir(false).map(|()| Place::Head),
            ["packed-refs"] => want_dir(false).map(|()| Place::PackedRefs),
            [LAYOUT_POLICY_FILE_NAME] => want_dir(false).and_then(|()| keep()),
            _ if is_kept_git_entry(rest, is_dir) => keep(),
            // config, hooks, index, info, shallow, objects/info, refs other
            // than branches and ours, …: made fresh or not ours to take.
            _ => Ok(Place::Skip),
        },
        _ => Err(bad(
            "is not part of an agent export (expected mini-letta-export.json, agent.json, \
             memory/, memory.git/, conversations/)",
        )),
    }
}

/// Whether `rest` (a path inside `memory.git/`) is history the imported
/// repository needs: the object store's loose objects and packs, and
/// branches and mini-letta's own refs (with their reflogs). Nothing else
/// — `objects/info/alternates` would read another repository's objects,
/// `refs/replace/` swap objects for the git CLI, `refs/remotes/` name a
/// remote of the host that made the archive.
fn is_kept_git_entry(rest: &[&str], is_dir: bool) -> bool {
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let kept_ref = |r: &[&str]| matches!(r, ["heads" | "mini-letta", ..]);
    match rest {
        ["objects"] | ["objects", "pack"] | ["refs"] | ["logs"] | ["logs", "refs"] => is_dir,
        ["objects", dir] => is_dir && hex(dir, 2),
        ["objects", "pack", file] => {
            let stem = file
                .strip_prefix("pack-")
                .and_then(|f| f.rsplit_once('.'))
                .filter(|(_, ext)| matches!(*ext, "pack" | "idx" | "rev"));
            !is_dir && stem.is_some_and(|(h, _)| hex(h, 40) || hex(h, 64))
        }
        ["objects", dir, file] => !is_dir && hex(dir, 2) && (hex(file, 38) || hex(file, 62)),
        ["refs", r @ ..] => kept_ref(r),
        ["logs", "HEAD"] => !is_dir,
        ["logs", "refs", r @ ..] => kept_ref(r),
        _ => false,
    }
}

/// Whether a ref of the archive's `packed-refs` is kept (see
/// [`is_kept_git_entry`]).
fn is_kept_ref(name: &str) -> bool {
    (name.starts_with("refs/heads/") || name.starts_with("refs/mini-letta/"))
        && git2::Reference::is_valid_name(name)
}

/// `packed-refs` with only the lines of kept refs: the header, each kept
/// `<oid> <ref>` line and the `^<oid>` peel line that follows it.
fn filter_packed_refs(text: &str) -> String {
    let mut out = String::new();
    let mut last_kept = false;
    for line in text.lines() {
        let keep = if line.starts_with('#') {
            last_kept = false;
            out.is_empty()
        } else if line.starts_with('^') {
            last_kept
        } else {
            let kept = line
                .split_once(' ')
                .is_some_and(|(oid, name)| git2::Oid::from_str(oid).is_ok() && is_kept_ref(name));
            last_kept = kept;
            kept
        };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The first pass's findings.
struct Checked {
    manifest: Manifest,
    record: AgentRecord,
    policy: Option<Policy>,
}

/// Read every entry of the archive at `file`, calling `each` for those
/// that pass [`classify`] and the limits.
fn walk(
    file: &Path,
    limits: Limits,
    mut each: impl FnMut(
        Place,
        &mut tar::Entry<'_, flate2::read::GzDecoder<io::BufReader<fs::File>>>,
        u64,
    ) -> Result<(), ArchiveError>,
) -> Result<(), ArchiveError> {
    prescan(file, limits)?;
    let f = fs::File::open(file).map_err(io_err(file))?;
    let corrupt = |source| ArchiveError::Corrupt {
        file: file.to_path_buf(),
        source,
    };
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(io::BufReader::new(f)));
    let mut count = 0u64;
    let mut total = 0u64;
    let mut seen = BTreeSet::new();
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        count += 1;
        if count > limits.max_entries {
            return Err(ArchiveError::TooManyEntries {
                max: limits.max_entries,
            });
        }
        let kind = entry.header().entry_type();
        // The size the reader goes by (a PAX `size` overrides the header's).
        let size = entry.size();
        total = total.saturating_add(size);
        if total > limits.max_total_bytes {
            return Err(ArchiveError::TooLarge {
                max: limits.max_total_bytes,
            });
        }
        let raw = entry.path_bytes().into_owned();
        let place = classify(&raw, kind)?;
        if kind.is_dir() && size != 0 {
            return Err(ArchiveError::BadEntry {
                entry: String::from_utf8_lossy(&raw).into_owned(),
                why: "a directory with contents".into(),
            });
        }
        if place != Place::Skip {
            let key = match &place {
                Place::Keep(p) => p.to_string_lossy().into_owned(),
                other => format!("{other:?}"),
            };
            if !seen.insert(key) {
                return Err(ArchiveError::BadEntry {
                    entry: String::from_utf8_lossy(&raw).into_owned(),
                    why: "appears twice".into(),
                });
            }
        }
        each(place, &mut entry, size)?;
    }
    Ok(())
}

/// Largest GNU long-name or PAX extension entry accepted.
const MAX_EXTENSION_BYTES: u64 = 64 * 1024;

/// A first look at the raw 512-byte blocks, before the tar reader sees
/// them: entries and their sizes (PAX `size` included) within `limits`,
/// and no long-name or PAX extension over [`MAX_EXTENSION_BYTES`] (the tar
/// reader holds those in memory whole, so a huge one would be a memory
/// bomb). Data is read and dropped, never kept. Malformed blocks are left
/// for the tar reader to refuse.
fn prescan(file: &Path, limits: Limits) -> Result<(), ArchiveError> {
    let f = fs::File::open(file).map_err(io_err(file))?;
    let mut r = flate2::read::GzDecoder::new(io::BufReader::new(f));
    let corrupt = |source| ArchiveError::Corrupt {
        file: file.to_path_buf(),
        source,
    };
    let padded = |n: u64| n.div_ceil(512).saturating_mul(512);
    let mut block = [0u8; 512];
    let (mut count, mut total) = (0u64, 0u64);
    let mut pax_size: Option<u64> = None;
    loop {
        match r.read_exact(&mut block) {
            Ok(()) => {}
            // A short archive: the tar reader says what is wrong with it.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(corrupt(e)),
        }
        if block.iter().all(|b| *b == 0) {
            return Ok(());
        }
        count += 1;
        if count > limits.max_entries {
            return Err(ArchiveError::TooManyEntries {
                max: limits.max_entries,
            });
        }
        let header = tar::Header::from_byte_slice(&block);
        let kind = header.entry_type();
        let Ok(mut size) = header.entry_size() else {
            return Ok(()); // not a header: the tar reader refuses it
        };
        if kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions()
        {
            if size > MAX_EXTENSION_BYTES {
                return Err(ArchiveError::BadEntry {
                    entry: String::from_utf8_lossy(&header.path_bytes()).into_owned(),
                    why: format!(
                        "an extension header of {size} bytes (at most {MAX_EXTENSION_BYTES})"
                    ),
                });
            }
            let mut data = Vec::new();
            (&mut r)
                .take(padded(size))
                .read_to_end(&mut data)
                .map_err(corrupt)?;
            if kind.is_pax_local_extensions() {
                data.truncate(usize::try_from(size).unwrap_or(data.len()));
                pax_size = tar::PaxExtensions::new(&data)
                    .filter_map(Result::ok)
                    .filter(|e| e.key() == Ok("size"))
                    .filter_map(|e| e.value().ok()?.parse().ok())
                    .last();
            }
            continue;
        }
        if let Some(s) = pax_size.take() {
            size = s;
        }
        total = total.saturating_add(size);
        if total > limits.max_total_bytes {
            return Err(ArchiveError::TooLarge {
                max: limits.max_total_bytes,
            });
        }
        let want = padded(size);
        let got = io::copy(&mut (&mut r).take(want), &mut io::sink()).map_err(corrupt)?;
        if got < want {
            return Ok(());
        }
    }
}

fn read_small(r: &mut impl Read, size: u64, max: u64, what: &str) -> Result<Vec<u8>, ArchiveError> {
    if size > max {
        return Err(ArchiveError::NotAnExport(format!(
            "{what} is {size} bytes (at most {max} expected)"
        )));
    }
    let mut buf = Vec::new();
    r.take(max)
        .read_to_end(&mut buf)
        .map_err(|e| ArchiveError::NotAnExport(format!("{what}: {e}")))?;
    Ok(buf)
}

/// `HEAD`'s contents: a symbolic ref to a branch, or a commit id.
fn check_head(bytes: &[u8]) -> Result<(), ArchiveError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| bad_repo("memory.git/HEAD is not text"))?
        .trim_end_matches('\n');
    let ok = match text.strip_prefix("ref: ") {
        Some(r) => r.starts_with("refs/heads/") && git2::Reference::is_valid_name(r),
        None => {
            (text.len() == 40 || text.len() == 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
        }
    };
    if ok {
        Ok(())
    } else {
        Err(bad_repo(format!(
            "memory.git/HEAD is neither a branch nor a commit id: {text:?}"
        )))
    }
}

/// Pass one: every header and the small files, nothing written.
fn check_archive(file: &Path, limits: Limits) -> Result<Checked, ArchiveError> {
    let mut manifest = None;
    let mut record = None;
    let mut policy = None;
    let mut head = false;
    let mut memory = false;
    walk(file, limits, |place, entry, size| {
        match place {
            Place::Manifest => {
                let bytes = read_small(entry, size, MAX_SMALL_FILE, MANIFEST_NAME)?;
                let m: Manifest = serde_json::from_slice(&bytes)
                    .map_err(|e| ArchiveError::NotAnExport(format!("{MANIFEST_NAME}: {e}")))?;
                if m.format != FORMAT || m.version != FORMAT_VERSION {
                    return Err(ArchiveError::NotAnExport(format!(
                        "{MANIFEST_NAME} says format {:?} version {}; this mini-letta reads \
                         {FORMAT:?} version {FORMAT_VERSION}",
                        m.format, m.version
                    )));
                }
                manifest = Some(m);
            }
            Place::Record => {
                let bytes = read_small(entry, size, MAX_SMALL_FILE, RECORD_NAME)?;
                let r: AgentRecord = serde_json::from_slice(&bytes)
                    .map_err(|e| ArchiveError::BadRecord(e.to_string()))?;
                record = Some(r);
            }
            Place::Head => {
                check_head(&read_small(entry, size, MAX_HEAD_BYTES, "memory.git/HEAD")?)?;
                head = true;
            }
            Place::Keep(p) if p == Path::new(MEMORY_GIT_DIR_NAME).join(LAYOUT_POLICY_FILE_NAME) => {
                let bytes = read_small(entry, size, 256, LAYOUT_POLICY_FILE_NAME)?;
                policy = Some(Policy::from_policy_file(std::str::from_utf8(&bytes).ok()));
            }
            Place::Keep(p) => memory |= p.starts_with(MEMORY_DIR_NAME),
            Place::PackedRefs | Place::Skip => {}
        }
        Ok(())
    })?;
    let manifest =
        manifest.ok_or_else(|| ArchiveError::NotAnExport(format!("no {MANIFEST_NAME} in it")))?;
    let record = record.ok_or_else(|| ArchiveError::NotAnExport("no agent.json in it".into()))?;
    if !head {
        return Err(ArchiveError::NotAnExport(
            "no memory repository (memory.git/HEAD) in it".into(),
        ));
    }
    if !memory {
        return Err(ArchiveError::NotAnExport(
            "no memory working tree (memory/) in it".into(),
        ));
    }
    Ok(Checked {
        manifest,
        record,
        policy,
    })
}

/// Import the agent archived in `file`. Returns its record as stored.
pub fn import(
    home: &Home,
    file: &Path,
    opts: &ImportOptions<'_>,
) -> Result<AgentRecord, ArchiveError> {
    let checked = check_archive(file, opts.limits)?;
    let mut record = checked.record;
    if !crate::paths::is_valid_agent_id(&record.id) {
        return Err(ArchiveError::BadRecord(format!(
            "invalid agent id {:?}",
            record.id
        )));
    }
    if record.id != checked.manifest.agent_id {
        return Err(ArchiveError::BadRecord(format!(
            "agent.json names agent {} but the manifest {}",
            record.id, checked.manifest.agent_id
        )));
    }
    if let Some(name) = &opts.name {
        record.name = name.clone();
    }
    store::check_name(&record.name)?;
    record.check_untrusted().map_err(ArchiveError::BadRecord)?;
    if let Some(check) = opts.check_model {
        check(&record.model).map_err(|why| ArchiveError::BadModel {
            model: record.model.clone(),
            why,
        })?;
    }
    // A uid belongs to a host: this one gets its own at first launch.
    record.sandbox_uid = None;

    // Refused early (nothing unpacked), and checked again under the names
    // lock just before the agent is put in place.
    check_free(home, &record)?;
    let agents = home.agents_dir();
    fs::create_dir_all(&agents).map_err(io_err(&agents))?;
    let staging = tempfile::Builder::new()
        .prefix(&format!("{IMPORT_STAGING_PREFIX}{}-", record.id))
        .tempdir_in(&agents)
        .map_err(io_err(&agents))?;
    let paths = AgentPaths::from_dir(staging.path());
    unpack(file, opts.limits, &paths)?;
    finish_repository(&paths, checked.policy)?;
    store::save(&paths, &record)?;
    // Private, as a new agent's directory is (see `store::create`).
    fs::set_permissions(
        staging.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .map_err(io_err(staging.path()))?;
    let _names = store::lock_names(home)?;
    check_free(home, &record)?;
    let staged = staging.keep();
    store::place_agent_dir(home, &record, &staged)?;
    store::reindex(home);
    Ok(record)
}

/// No agent here has `record`'s id or name.
fn check_free(home: &Home, record: &AgentRecord) -> Result<(), ArchiveError> {
    let listing = store::list_all(home)?;
    let dir_there = home
        .agent(&record.id)
        .map_err(StoreError::from)?
        .dir()
        .exists();
    if listing.has_id(&record.id) || dir_there {
        let name = listing
            .agents
            .iter()
            .find(|a| a.id == record.id)
            .map(|a| format!("named {:?}", a.name))
            .unwrap_or_else(|| "unreadable".into());
        return Err(ArchiveError::IdTaken {
            id: record.id.clone(),
            name,
        });
    }
    if listing.name_taken(&record.name, None) {
        return Err(ArchiveError::NameTaken(record.name.clone()));
    }
    Ok(())
}

/// Pass two: a fresh, linked repository, then the archive's files over it.
fn unpack(file: &Path, limits: Limits, paths: &AgentPaths) -> Result<(), ArchiveError> {
    repo::init_linked(&paths.memory_dir(), &paths.memory_git_dir())?;
    let root = paths.dir();
    walk(file, limits, |place, entry, size| {
        let rel = match place {
            Place::Keep(rel) => rel,
            Place::Head => {
                let bytes = read_small(entry, size, MAX_HEAD_BYTES, "memory.git/HEAD")?;
                check_head(&bytes)?;
                let path = paths.memory_git_dir().join("HEAD");
                return fs::write(&path, bytes).map_err(io_err(&path));
            }
            Place::PackedRefs => {
                let bytes = read_small(entry, size, MAX_PACKED_REFS, "memory.git/packed-refs")?;
                let text = std::str::from_utf8(&bytes)
                    .map_err(|_| bad_repo("memory.git/packed-refs is not text"))?;
                let path = paths.memory_git_dir().join("packed-refs");
                return fs::write(&path, filter_packed_refs(text)).map_err(io_err(&path));
            }
            Place::Manifest | Place::Record | Place::Skip => return Ok(()),
        };
        let path = root.join(&rel);
        if entry.header().entry_type().is_dir() {
            return fs::create_dir_all(&path).map_err(io_err(&path));
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        let exec = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .mode(if exec { 0o755 } else { 0o644 })
            .open(&path)
            .map_err(io_err(&path))?;
        let copied = io::copy(&mut entry.take(size), &mut out).map_err(io_err(&path))?;
        if copied != size {
            return Err(ArchiveError::Corrupt {
                file: file.to_path_buf(),
                source: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{} ends early", rel.display()),
                ),
            });
        }
        Ok(())
    })
}

/// The unpacked repository: `HEAD` resolves, every object any ref reaches
/// is in its own object store, `HEAD`'s tree passes the validator; then
/// the layout policy, the hook and an index matching `HEAD` are written.
pub(crate) fn finish_repository(
    paths: &AgentPaths,
    policy: Option<Policy>,
) -> Result<(), ArchiveError> {
    let git_dir = paths.memory_git_dir();
    // Sealed (`repo::seal`): objects are read from `objects/` alone.
    let repo = repo::open_agent(paths)?;
    // Names resolved to ids without reading objects: what is missing is
    // reported by the connectivity check, by id.
    let head_id = repo
        .refname_to_id("HEAD")
        .map_err(|e| bad_repo(format!("HEAD does not resolve: {}", e.message())))?;
    let mut tips = vec![("HEAD".to_string(), head_id)];
    for r in repo.references().map_err(bad_repo)? {
        let r = r.map_err(bad_repo)?;
        let name = r.name().unwrap_or("?").to_string();
        let target = r
            .resolve()
            .ok()
            .and_then(|r| r.target())
            .ok_or_else(|| bad_repo(format!("{name} does not resolve")))?;
        tips.push((name, target));
    }
    check_connected(&repo, &tips)?;
    let head = repo.find_commit(head_id).map_err(|e| {
        bad_repo(format!(
            "HEAD does not resolve to a commit: {}",
            e.message()
        ))
    })?;
    let tree = head.tree().map_err(bad_repo)?;

    let policy = policy.unwrap_or(Policy::RootMarker);
    let report = validate::audit_revision(&repo, "HEAD", &ValidateOptions::new(policy))
        .map_err(|e| ArchiveError::InvalidMemory(e.to_string()))?;
    if !report.is_ok() {
        return Err(ArchiveError::InvalidMemory(report.render_audit()));
    }

    let mut index = repo.index().map_err(bad_repo)?;
    index.read_tree(&tree).map_err(bad_repo)?;
    index.write().map_err(bad_repo)?;
    hook::write_layout_policy(&git_dir, policy)?;
    if let Some(bin) = hook::self_binary() {
        hook::install(&git_dir, &bin)?;
    }
    Ok(())
}

/// Every object reachable from `tips` (commits, their parents and trees,
/// trees' entries, tags' targets) is in `repo`'s object store — which,
/// opened sealed, is the archive's own: an archive borrowing objects from
/// anywhere else is refused, naming the first one it lacks.
fn check_connected(
    repo: &git2::Repository,
    tips: &[(String, git2::Oid)],
) -> Result<(), ArchiveError> {
    use git2::ObjectType;
    let odb = repo.odb().map_err(bad_repo)?;
    let mut seen = std::collections::HashSet::new();
    let mut todo: Vec<(git2::Oid, ObjectType, String)> = tips
        .iter()
        .map(|(name, oid)| (*oid, ObjectType::Any, name.clone()))
        .collect();
    while let Some((oid, kind, from)) = todo.pop() {
        if !seen.insert(oid) {
            continue;
        }
        if seen.len() > MAX_OBJECTS {
            return Err(bad_repo(format!("more than {MAX_OBJECTS} objects")));
        }
        let missing = || {
            bad_repo(format!(
                "object {oid} (reached from {from}) is missing from the archive's own objects; \
                 an archive must carry every object its branches reach"
            ))
        };
        if kind == ObjectType::Blob {
            if !odb.exists(oid) {
                return Err(missing());
            }
            continue;
        }
        let object = repo.find_object(oid, None).map_err(|_| missing())?;
        match object.kind() {
            Some(ObjectType::Commit) => {
                let commit = object.peel_to_commit().map_err(bad_repo)?;
                let here = format!("commit {oid}");
                todo.push((commit.tree_id(), ObjectType::Tree, here.clone()));
                for parent in commit.parent_ids() {
                    todo.push((parent, ObjectType::Commit, here.clone()));
                }
            }
            Some(ObjectType::Tree) => {
                let tree = object.peel_to_tree().map_err(bad_repo)?;
                for e in tree.iter() {
                    let path = format!("{from}: {}", e.name().unwrap_or("?"));
                    // Gitlinks name another repository's commit: the
                    // validator judges them.
                    if let Some(k @ (ObjectType::Blob | ObjectType::Tree)) = e.kind() {
                        todo.push((e.id(), k, path));
                    }
                }
            }
            Some(ObjectType::Tag) => {
                let tag = object
                    .into_tag()
                    .map_err(|_| bad_repo(format!("tag {oid}")))?;
                todo.push((tag.target_id(), ObjectType::Any, format!("tag {oid}")));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(path: &str, kind: tar::EntryType) -> Result<Place, String> {
        classify(path.as_bytes(), kind).map_err(|e| e.to_string())
    }

    #[test]
    fn entries_are_judged_by_type_and_path() {
        use tar::EntryType::{Block, Char, Directory, Fifo, Link, Regular, Symlink};
        assert_eq!(place("agent.json", Regular), Ok(Place::Record));
        assert_eq!(
            place("./mini-letta-export.json", Regular),
            Ok(Place::Manifest)
        );
        assert_eq!(place("memory.git/HEAD", Regular), Ok(Place::Head));
        assert_eq!(
            place("memory/human.md", Regular),
            Ok(Place::Keep("memory/human.md".into()))
        );
        assert_eq!(
            place("memory.git/objects/ab/", Directory),
            Ok(Place::Keep("memory.git/objects/ab".into()))
        );
        let loose = format!("memory.git/objects/ab/{}", "c".repeat(38));
        let pack = format!("memory.git/objects/pack/pack-{}.idx", "d".repeat(40));
        for kept in [
            "memory.git/refs/heads/main",
            "memory.git/refs/heads/mini-letta/reflection/x",
            "memory.git/refs/mini-letta/agent",
            "memory.git/logs/HEAD",
            "memory.git/logs/refs/heads/main",
            &loose,
            &pack,
        ] {
            assert_eq!(place(kept, Regular), Ok(Place::Keep(kept.into())), "{kept}");
        }
        assert_eq!(
            place("memory.git/packed-refs", Regular),
            Ok(Place::PackedRefs)
        );
        for skipped in [
            "memory.git/config",
            "memory.git/hooks/pre-commit",
            "memory.git/index",
            "memory.git/refs/heads/main.lock",
            "memory/.git",
            "memory.git/objects/info/alternates",
            "memory.git/objects/info/http-alternates",
            "memory.git/objects/info/commit-graph",
            "memory.git/objects/info/packs",
            "memory.git/objects/stray",
            "memory.git/objects/ab/short",
            "memory.git/objects/pack/multi-pack-index",
            "memory.git/info/grafts",
            "memory.git/shallow",
            "memory.git/refs/replace/0123",
            "memory.git/refs/remotes/origin/main",
            "memory.git/refs/tags/v1",
            "memory.git/logs/refs/remotes/origin/main",
        ] {
            assert_eq!(place(skipped, Regular), Ok(Place::Skip), "{skipped}");
        }
        assert_eq!(place("./", Directory), Ok(Place::Skip));
        for (path, kind, why) in [
            ("../evil", Regular, "`..`"),
            ("memory/../../evil", Regular, "`..`"),
            ("/etc/passwd", Regular, "absolute"),
            ("memory/a.md", Symlink, "symbolic link"),
            ("memory/a.md", Link, "hard link"),
            ("memory/a", Char, "character device"),
            ("memory/a", Block, "block device"),
            ("memory/a", Fifo, "FIFO"),
            ("tmp/x", Regular, "not part of an agent export"),
            ("agent.json", Directory, "regular file"),
            ("memory", Regular, "directory"),
            ("memory//a", Regular, "empty"),
            ("memory/./a", Regular, "empty"),
        ] {
            let e = place(path, kind).unwrap_err();
            assert!(e.contains(why), "{path}: {e}");
        }
    }

    #[test]
    fn packed_refs_keep_only_branches_and_ours() {
        let (a, b) = ("a".repeat(40), "b".repeat(40));
        let text = format!(
            "# pack-refs with: peeled fully-peeled sorted \n\
             {a} refs/heads/main\n\
             {b} refs/mini-letta/agent\n\
             {b} refs/remotes/origin/main\n\
             {b} refs/replace/{a}\n\
             {a} refs/tags/v1\n\
             ^{b}\n\
             # a second header\n\
             junk\n"
        );
        assert_eq!(
            filter_packed_refs(&text),
            format!(
                "# pack-refs with: peeled fully-peeled sorted \n\
                 {a} refs/heads/main\n\
                 {b} refs/mini-letta/agent\n"
            )
        );
    }

    #[test]
    fn head_must_name_a_branch_or_commit() {
        assert!(check_head(b"ref: refs/heads/main\n").is_ok());
        assert!(check_head(b"0123456789012345678901234567890123456789\n").is_ok());
        for bad in [
            &b"ref: ../../x"[..],
            b"ref: refs/heads/..",
            b"hello",
            b"\xff",
        ] {
            assert!(check_head(bad).is_err(), "{bad:?}");
        }
    }
}
