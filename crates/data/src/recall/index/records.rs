//! The records of the two logs, `[u32 length][u32 CRC-32][payload]`:
//! reading the valid ones, appending one, and the base record a
//! compaction starts a log with.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

/// Largest index log read (the child can grow it).
pub const MAX_INDEX_BYTES: u64 = 1 << 30;

/// A log's first record after compaction: this tag and the generation.
pub(super) const BASE_TAG: &[u8; 4] = b"BASE";

/// The generation a log's base record names, if `payload` is one.
pub(super) fn base_gen(payload: &[u8]) -> Option<u64> {
    let rest = payload.strip_prefix(BASE_TAG.as_slice())?;
    let b: [u8; 8] = rest.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

/// The valid records of a log and the length they take: reading stops at
/// the first torn or corrupt one.
pub(super) fn records(data: &[u8]) -> (u64, Vec<&[u8]>) {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(head) = data.get(at..at + 8) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let Some(payload) = data.get(at + 8..at + 8 + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        out.push(payload);
        at += 8 + len;
    }
    (at as u64, out)
}

/// Append one record in a single write; a failed write is undone.
pub(super) fn append_record(file: &mut File, payload: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| std::io::Error::other("recall record over 4 GiB"))?;
    let mut rec = Vec::with_capacity(payload.len() + 8);
    rec.extend_from_slice(&len.to_le_bytes());
    rec.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    rec.extend_from_slice(payload);
    let before = file.metadata()?.len();
    if let Err(e) = file.write_all(&rec) {
        let _ = file.set_len(before);
        return Err(e);
    }
    Ok(())
}

pub(super) fn read_all(file: &File) -> std::io::Result<Vec<u8>> {
    let size = file.metadata()?.len();
    if size > MAX_INDEX_BYTES {
        return Err(std::io::Error::other(format!(
            "{size} bytes is over the {MAX_INDEX_BYTES}-byte index limit"
        )));
    }
    let mut buf = Vec::with_capacity(size as usize);
    let mut f = file;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0))?;
    f.take(MAX_INDEX_BYTES).read_to_end(&mut buf)?;
    Ok(buf)
}

pub(super) fn read_at_full(file: &File, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], pos + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn records_stop_at_a_torn_or_corrupt_one() {
        let mut f = tempfile::tempfile().unwrap();
        append_record(&mut f, b"one").unwrap();
        append_record(&mut f, b"two").unwrap();
        let data = read_all(&f).unwrap();
        let (good, recs) = records(&data);
        assert_eq!(recs, [b"one".as_slice(), b"two".as_slice()]);
        assert_eq!(good as usize, data.len());
        let (good, recs) = records(&data[..data.len() - 1]);
        assert_eq!(recs.len(), 1);
        assert_eq!(good, 11);
        let mut bad = data.clone();
        bad[9] ^= 1;
        assert_eq!(records(&bad).1.len(), 0);
    }
}
