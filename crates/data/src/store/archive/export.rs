//! `agent export`: the agent's directory, read through descriptors, as a
//! gzip-compressed tar archive written beside `out` and renamed over it.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use time::OffsetDateTime;

use super::error::{ArchiveError, io_err};
use super::format::{
    FORMAT, FORMAT_VERSION, Limits, MANIFEST_NAME, MAX_DEPTH, Manifest, RECORD_NAME,
};
use crate::agentfs::{Dir, FsError, Kind};
use crate::memfs::lock::RepoLock;
use crate::paths::{
    CONVERSATIONS_DIR_NAME, Home, LAYOUT_POLICY_FILE_NAME, MEMORY_DIR_NAME, MEMORY_GIT_DIR_NAME,
    RECALL_DIR_NAME,
};
use crate::store;

/// Entries of one directory read by the export.
const MAX_DIR_ENTRIES: usize = 200_000;
/// Largest single file the export reads (it is held in memory).
const MAX_EXPORT_FILE: u64 = 512 << 20;

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
    /// The archive's own size on disk (compressed).
    pub archive_bytes: u64,
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
        exported_at: crate::clock::js_iso(crate::clock::now()),
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
    let archive_bytes = finish(tar, tmp, out, &parent)?;
    Ok(Exported {
        path: out.to_path_buf(),
        id: record.id,
        name: record.name,
        entries,
        bytes,
        archive_bytes,
        skipped,
    })
}

/// Close the archive (gzip trailer, data on disk, owner-only), rename it
/// over `out` and sync `parent`: its size on disk.
fn finish(
    tar: tar::Builder<flate2::write::GzEncoder<io::BufWriter<fs::File>>>,
    tmp: tempfile::NamedTempFile,
    out: &Path,
    parent: &Path,
) -> Result<u64, ArchiveError> {
    let gz = tar.into_inner().map_err(io_err(out))?;
    let mut buf = gz.finish().map_err(io_err(out))?;
    buf.flush().map_err(io_err(out))?;
    drop(buf);
    tmp.as_file().sync_all().map_err(io_err(tmp.path()))?;
    tmp.as_file()
        .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io_err(tmp.path()))?;
    let size = tmp.as_file().metadata().map_err(io_err(tmp.path()))?.len();
    tmp.persist(out).map_err(|e| io_err(out)(e.error))?;
    if let Ok(d) = fs::File::open(parent) {
        let _ = d.sync_all();
    }
    Ok(size)
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
