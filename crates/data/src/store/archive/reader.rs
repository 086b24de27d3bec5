//! Reading an archive: a first look at its raw blocks, the walk over its
//! entries both passes use (each judged and counted against the limits),
//! and pass one, which reads the small files and writes nothing.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read};
use std::path::Path;

use super::entries::{Place, check_head, classify};
use super::error::{ArchiveError, io_err};
use super::format::{FORMAT, FORMAT_VERSION, Limits, MANIFEST_NAME, Manifest, RECORD_NAME};
use crate::memfs::validate::Policy;
use crate::paths::{LAYOUT_POLICY_FILE_NAME, MEMORY_DIR_NAME, MEMORY_GIT_DIR_NAME};
use crate::store::record::AgentRecord;

/// `agent.json` and the manifest are small; anything bigger is not ours.
const MAX_SMALL_FILE: u64 = 1 << 20;
/// `memory.git/HEAD` is one line.
pub(super) const MAX_HEAD_BYTES: u64 = 4096;

/// The first pass's findings.
pub(super) struct Checked {
    pub(super) manifest: Manifest,
    pub(super) record: AgentRecord,
    pub(super) policy: Option<Policy>,
}

/// Read every entry of the archive at `file`, calling `each` for those
/// that pass [`classify`] and the limits.
pub(super) fn walk(
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

pub(super) fn read_small(
    r: &mut impl Read,
    size: u64,
    max: u64,
    what: &str,
) -> Result<Vec<u8>, ArchiveError> {
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

/// Pass one: every header and the small files, nothing written.
pub(super) fn check_archive(file: &Path, limits: Limits) -> Result<Checked, ArchiveError> {
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
