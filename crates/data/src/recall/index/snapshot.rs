//! The compacted index, `snapshot-v3.bin`, read in place: opening maps
//! it, checks its footer and the small tables a lookup needs (terms,
//! conversations) against one CRC, and leaves the rest to be checked
//! piece by piece when first read — a term's postings against the CRC
//! they start with, a block of message columns against its CRC in the
//! block table. What fails a check marks the index corrupt (it is then
//! rebuilt); every read is bounds-checked, so a forged file cannot make
//! a reader panic or allocate past its size.
//!
//! Layout, in file order (little-endian):
//! postings (per term in term order: `[u32 CRC][encoded postings]`);
//! the postings table (`n_terms + 1` u64 file offsets);
//! term offsets (`n_terms + 1` u32 into the term text); the term text
//! (terms sorted, so a term is found by binary search); the conversation
//! table (varint count, then per conversation its id and covered bytes);
//! six message columns, each 8-aligned (conversation u32, line length
//! u32, token count u32, role u8, line offset u64, time i64); the block
//! CRCs (per column, per `docs::BLOCK` messages, u32); and the footer
//! ([`FOOTER_LEN`] bytes: magic, generation, counts, where each section
//! starts, and the CRC of the term tables, conversation table, block CRCs
//! and footer). Written front to back in one pass, so a compaction never
//! holds the file in memory.

use std::cell::OnceCell;
use std::fs::File;
use std::sync::Arc;

use super::codec::{bytes, varint};
use super::docs::{COLUMNS, Columns, Docs, WIDTH, blocks};
use super::map::Map;
use super::postings::{Postings, decode_postings};
use super::state::{Index, MAX_CONVERSATIONS, Snapshot};
use crate::paths::is_valid_agent_id;

/// The compacted index.
pub use crate::paths::RECALL_SNAPSHOT_FILE_NAME as SNAPSHOT_FILE_NAME;
pub(super) const SNAPSHOT_MAGIC: &[u8; 8] = b"MLRECAL3";
/// The footer: magic, generation, `n_terms`, `n_docs`, the postings
/// table, term offsets, term text, conversations, six columns and block
/// CRCs (u64 each), the CRC, four zero bytes.
pub(super) const FOOTER_LEN: usize = 128;
const CRC_AT: usize = FOOTER_LEN - 8;

/// Where a snapshot's sections start.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct Footer {
    pub(super) generation: u64,
    pub(super) n_terms: u64,
    pub(super) n_docs: u64,
    pub(super) post_table: u64,
    pub(super) term_offs: u64,
    pub(super) term_blob: u64,
    pub(super) convs: u64,
    pub(super) cols: [u64; COLUMNS],
    pub(super) crcs: u64,
}

impl Footer {
    /// The footer up to its CRC.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = SNAPSHOT_MAGIC.to_vec();
        let fields = [
            self.generation,
            self.n_terms,
            self.n_docs,
            self.post_table,
            self.term_offs,
            self.term_blob,
            self.convs,
        ];
        for v in fields.iter().chain(&self.cols).chain([&self.crcs]) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub(super) fn decode(b: &[u8]) -> Option<Footer> {
        let rest = b.strip_prefix(SNAPSHOT_MAGIC.as_slice())?;
        let v = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                rest.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        let mut cols = [0u64; COLUMNS];
        for (c, col) in cols.iter_mut().enumerate() {
            *col = v(7 + c)?;
        }
        Some(Footer {
            generation: v(0)?,
            n_terms: v(1)?,
            n_docs: v(2)?,
            post_table: v(3)?,
            term_offs: v(4)?,
            term_blob: v(5)?,
            convs: v(6)?,
            cols,
            crcs: v(7 + COLUMNS)?,
        })
    }
}

fn u32_at(b: &Map, at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(b: &Map, at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

impl Snapshot {
    /// The snapshot file's length (0 without one).
    pub(super) fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    /// Bytes `range` of the snapshot, read in if need be.
    fn get(&self, range: std::ops::Range<usize>) -> Option<&[u8]> {
        self.map.as_ref()?.get(range)
    }

    fn u32_at(&self, at: usize) -> Option<u32> {
        u32_at(self.map.as_ref()?, at)
    }

    fn u64_at(&self, at: usize) -> Option<u64> {
        u64_at(self.map.as_ref()?, at)
    }

    /// Let go of the bytes read so far.
    ///
    /// # Safety
    /// No slice of the snapshot ([`Self::term`], [`Self::stored`]) may be
    /// alive.
    pub(super) unsafe fn release(&self) {
        if let Some(m) = &self.map {
            // SAFETY: passed on from our caller.
            unsafe { m.release() };
        }
    }

    /// The text of snapshot term `i`.
    pub(super) fn term(&self, i: u32) -> Option<&[u8]> {
        let at = self.term_offs.checked_add(i as usize * 4)?;
        let (s, e) = (self.u32_at(at)? as usize, self.u32_at(at + 4)? as usize);
        self.get(self.term_blob.checked_add(s)?..self.term_blob.checked_add(e)?)
    }

    /// The id of `term` among the snapshot's (sorted) terms.
    pub(super) fn find(&self, term: &str) -> Option<u32> {
        let (mut lo, mut hi) = (0u32, self.n_terms);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.term(mid)?.cmp(term.as_bytes()) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// Snapshot term `i`'s postings as stored, CRC first, unchecked;
    /// `None` when they lie outside the postings.
    pub(super) fn stored(&self, i: u32) -> Option<&[u8]> {
        let at = self.post_table.checked_add(i as usize * 8)?;
        let s = usize::try_from(self.u64_at(at)?).ok()?;
        let e = usize::try_from(self.u64_at(at + 8)?).ok()?;
        if s.checked_add(4)? > e || e > self.post_table {
            return None;
        }
        self.get(s..e)
    }

    /// The encoded postings of snapshot term `i`; `None` when they fail
    /// their CRC or lie outside the postings.
    fn encoded(&self, i: u32) -> Option<&[u8]> {
        let (crc, body) = self.stored(i)?.split_at_checked(4)?;
        (crc32fast::hash(body).to_le_bytes() == crc).then_some(body)
    }

    /// The postings of snapshot term `i`; `None` when they fail their
    /// check (the index is corrupt).
    pub(super) fn postings(&self, i: u32, n_docs: usize) -> Option<Postings> {
        let p = self.encoded(i).and_then(|b| decode_postings(b, n_docs));
        if p.is_none() {
            tracing::warn!("recall index: the postings of term {i} fail their check");
        }
        p
    }
}

impl Index {
    /// Take `file` as the snapshot of generation `generation`; false (nothing
    /// changed) when it is not a whole snapshot of that generation.
    pub(super) fn load_snapshot(&mut self, file: &File, generation: u64) -> bool {
        let map = match Map::of(file) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                tracing::warn!("recall index: snapshot not opened for reading ({e})");
                return false;
            }
        };
        match parse_snapshot(map, generation) {
            Some((snap, convs, columns)) => {
                self.clear_memory();
                self.postings = (0..snap.n_terms).map(|_| OnceCell::new()).collect();
                self.snap = snap;
                for (id, covered) in convs {
                    let n = self.conv_number(&id);
                    if let Some(c) = self.convs.get_mut(n as usize) {
                        c.covered = covered;
                    }
                }
                self.docs = Docs::on(columns);
                true
            }
            None => false,
        }
    }
}

type SnapshotParts = (Snapshot, Vec<(String, u64)>, Columns);

/// Check a snapshot's footer and small tables, and find its
/// sections (the postings and columns are checked when read).
fn parse_snapshot(map: Arc<Map>, want_generation: u64) -> Option<SnapshotParts> {
    let b = &*map;
    let foot_at = b.len().checked_sub(FOOTER_LEN)?;
    let footer = b.get(foot_at..b.len())?;
    let f = Footer::decode(footer)?;
    if f.generation != want_generation {
        return None;
    }
    let size = |v: u64| usize::try_from(v).ok().filter(|&v| v <= foot_at);
    let (n_terms, n_docs) = (size(f.n_terms)?, size(f.n_docs)?);
    let (post_table, term_offs, term_blob) =
        (size(f.post_table)?, size(f.term_offs)?, size(f.term_blob)?);
    let (convs_at, crcs) = (size(f.convs)?, size(f.crcs)?);
    // The sections follow one another, each as long as its counts say.
    let ordered = post_table.checked_add((n_terms + 1).checked_mul(8)?)? == term_offs
        && term_offs.checked_add((n_terms + 1) * 4)? == term_blob
        && term_blob.checked_add(u32_at(b, term_blob - 4)? as usize)? == convs_at;
    if !ordered || u32::try_from(n_terms).is_err() {
        return None;
    }
    let mut cols = [0usize; COLUMNS];
    let mut end = convs_at;
    for (c, col) in cols.iter_mut().enumerate() {
        *col = size(f.cols[c])?;
        if *col < end {
            return None;
        }
        end = col.checked_add(n_docs.checked_mul(WIDTH[c])?)?;
    }
    if end > crcs || crcs.checked_add(COLUMNS * blocks(n_docs) * 4)? != foot_at {
        return None;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(b.get(term_offs..cols[0])?);
    h.update(b.get(crcs..foot_at + CRC_AT)?);
    let crc = footer.get(CRC_AT..CRC_AT + 4)?;
    if h.finalize().to_le_bytes() != crc {
        return None;
    }
    let convs = parse_convs(b.get(convs_at..cols[0])?)?;
    let s = Snapshot {
        map: Some(map.clone()),
        n_terms: n_terms as u32,
        term_offs,
        term_blob,
        post_table,
    };
    Some((s, convs, Columns::new(map, n_docs, cols, crcs)))
}

fn parse_convs(b: &[u8]) -> Option<Vec<(String, u64)>> {
    let mut at = 0;
    let n = varint(b, &mut at)?;
    if n > MAX_CONVERSATIONS as u64 {
        return None;
    }
    let mut convs = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let id = std::str::from_utf8(bytes(b, &mut at)?).ok()?;
        if !is_valid_agent_id(id) {
            return None;
        }
        convs.push((id.to_string(), varint(b, &mut at)?));
    }
    // What follows is the padding before the columns.
    b.get(at..)?.iter().all(|&x| x == 0).then_some(convs)
}
