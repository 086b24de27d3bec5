//! The snapshot file read in place, on demand: opening the index costs
//! the parts a query touches, not the file.
//!
//! Not a mapping of the file itself. The recall directory is writable by
//! the agent's child, and a reader of a mapped file that another process
//! truncates dies of SIGBUS when it touches a page past the new end: a
//! hostile child could crash whoever searches its index (the operator's
//! CLI, the palace). Instead the bytes land in a private anonymous region
//! as long as the file, filled by `pread` a chunk at a time the first time
//! a range is asked for. A file cut short reads short, which is reported
//! as "no such bytes" (the index is then rebuilt), never a signal; pages
//! never asked for are never resident.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes read at once: the unit of what becomes resident.
const CHUNK: usize = 64 * 1024;

/// A file's bytes, read into memory chunk by chunk as they are asked for.
pub(super) struct Map {
    file: File,
    ptr: NonNull<u8>,
    len: usize,
    /// One bit per chunk: read in (set only once its bytes are in place).
    loaded: Vec<AtomicU64>,
    /// Held while a chunk is read in (readers of loaded chunks do not wait).
    filling: Mutex<()>,
}

// SAFETY: the region is written only under `filling`, and only in chunks
// no slice has been handed out for (a slice is handed out after every
// chunk under it is loaded, and a loaded chunk is never written again
// except by `release`, whose caller guarantees no slice is alive).
unsafe impl Send for Map {}
// SAFETY: as above.
unsafe impl Sync for Map {}

impl Map {
    /// The bytes of `file` (as long as it is now), none read yet.
    pub(super) fn of(file: &File) -> std::io::Result<Map> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("file too large to read in place"))?;
        let file = file.try_clone()?;
        let chunks = len.div_ceil(CHUNK);
        let loaded = (0..chunks.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        if len == 0 {
            return Ok(Map {
                file,
                ptr: NonNull::dangling(),
                len: 0,
                loaded,
                filling: Mutex::new(()),
            });
        }
        // SAFETY: a fresh anonymous private region the kernel places; its
        // pages are zero until written, and become resident only then.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap"))?;
        Ok(Map {
            file,
            ptr,
            len,
            loaded,
            filling: Mutex::new(()),
        })
    }

    /// The file's length when it was opened.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn is_loaded(&self, chunk: usize) -> bool {
        self.loaded
            .get(chunk / 64)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (chunk % 64)) != 0)
    }

    /// Bytes `range` of the file; `None` when the range lies past its end
    /// or the file no longer holds them (it was cut short since).
    pub(super) fn get(&self, range: Range<usize>) -> Option<&[u8]> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        if range.is_empty() {
            return Some(&[]);
        }
        let (first, last) = (range.start / CHUNK, (range.end - 1) / CHUNK);
        if !(first..=last).all(|c| self.is_loaded(c)) {
            self.fill(first..=last)?;
        }
        // SAFETY: `range` lies within the region, and every chunk under it
        // is loaded: written once, before its bit was set, never again
        // while a slice may be alive (see `release`).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(range.start), range.len()) })
    }

    /// Read in the chunks of `chunks` not read yet.
    fn fill(&self, chunks: std::ops::RangeInclusive<usize>) -> Option<()> {
        let _held = self.filling.lock().unwrap_or_else(|p| p.into_inner());
        for c in chunks {
            if self.is_loaded(c) {
                continue;
            }
            let start = c * CHUNK;
            let n = CHUNK.min(self.len - start);
            // SAFETY: chunk `c` lies within the region and is not loaded,
            // so no slice covers it; only this holder of `filling` writes.
            let buf = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(start), n) };
            self.file.read_exact_at(buf, start as u64).ok()?;
            self.loaded
                .get(c / 64)?
                .fetch_or(1 << (c % 64), Ordering::Release);
        }
        Some(())
    }

    /// Let go of the bytes read so far (read again if asked for): a pass
    /// over the whole file does not keep it resident.
    ///
    /// # Safety
    /// No slice returned by [`Map::get`] may be alive: the memory under it
    /// is given back to the kernel.
    pub(super) unsafe fn release(&self) {
        if self.len == 0 {
            return;
        }
        let _held = self.filling.lock().unwrap_or_else(|p| p.into_inner());
        for w in &self.loaded {
            w.store(0, Ordering::Release);
        }
        // SAFETY: the range is this region; the caller guarantees nothing
        // borrows it, and every chunk is marked unread again first.
        unsafe {
            libc::madvise(self.ptr.as_ptr().cast(), self.len, libc::MADV_DONTNEED);
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the region made in `of`, unmapped once.
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn ranges_read_in_place_and_a_file_cut_short_reads_as_missing() {
        let mut f = tempfile::tempfile().unwrap();
        let bytes: Vec<u8> = (0..(3 * CHUNK + 100)).map(|i| (i % 253) as u8).collect();
        f.write_all(&bytes).unwrap();
        let m = Map::of(&f).unwrap();
        assert_eq!(m.len(), bytes.len());
        // Across a chunk boundary, and the tail.
        let r = CHUNK - 10..CHUNK + 10;
        assert_eq!(m.get(r.clone()), Some(&bytes[r]));
        let tail = bytes.len() - 50..bytes.len();
        assert_eq!(m.get(tail.clone()), Some(&bytes[tail]));
        assert_eq!(m.get(0..bytes.len() + 1), None);
        // Cut short by another process: what was read stays readable, what
        // was not is missing (no SIGBUS, as a mapping of the file gives).
        f.set_len(CHUNK as u64).unwrap();
        assert_eq!(m.get(CHUNK - 10..CHUNK + 10).map(<[u8]>::len), Some(20));
        assert_eq!(m.get(2 * CHUNK..2 * CHUNK + 8), None);
        // SAFETY: no slice of `m` is alive here.
        unsafe { m.release() };
        assert_eq!(m.get(CHUNK - 10..CHUNK + 10), None);
        assert_eq!(m.get(0..16), Some(&bytes[0..16]));
    }
}
