//! A file mapped read-only into memory: the snapshot is read in place, so
//! opening the index costs the pages a query touches, not the file.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// A private, read-only mapping of a whole file.
pub(super) struct Map {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone; sharing
// `&[u8]` views of it across threads is as safe as sharing a slice.
unsafe impl Send for Map {}
// SAFETY: as above: nothing writes through the mapping.
unsafe impl Sync for Map {}

impl Map {
    /// Map all of `file` (as long as it is now).
    pub(super) fn of(file: &File) -> std::io::Result<Map> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("file too large to map"))?;
        if len == 0 {
            return Ok(Map {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: a fresh mapping the kernel places; the descriptor is open
        // for reading. The index only ever replaces its snapshot by
        // renaming a new file over it, so the mapped bytes do not change
        // under a reader.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap"))?;
        Ok(Map { ptr, len })
    }

    pub(super) fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Let go of the pages read so far (they are read again if touched):
    /// a pass over the whole file does not keep it resident.
    pub(super) fn release(&self) {
        if self.len > 0 {
            // SAFETY: the range is this mapping; dropping the pages of a
            // private mapping never written to loses nothing.
            unsafe {
                libc::madvise(self.ptr.as_ptr().cast(), self.len, libc::MADV_DONTNEED);
            }
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `of`, unmapped once.
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.len);
            }
        }
    }
}
