//! The messages the index holds: the snapshot's, read in place from its
//! fixed-width columns (so a million of them cost nothing to open), and
//! those indexed since, in memory.

use std::cell::Cell;
use std::sync::Arc;

use super::codec::{role_code, role_of};
use super::map::Map;
use crate::protocol::messages::Role;

/// What the index keeps of one message.
#[derive(Debug, Clone, Copy)]
pub struct DocMeta {
    pub conv: u32,
    pub offset: u64,
    pub len: u32,
    /// Unix seconds of `ts` (0 when unparsable).
    pub ts: i64,
    pub role: Role,
    /// Tokens in the message (its BM25 length).
    pub dl: u32,
}

/// Messages per checksummed block of a column.
pub(super) const BLOCK: usize = 16_384;
/// The columns, in the order the snapshot stores them, and their widths.
pub(super) const CONV: usize = 0;
pub(super) const LEN: usize = 1;
pub(super) const DL: usize = 2;
pub(super) const ROLE: usize = 3;
pub(super) const OFFSET: usize = 4;
pub(super) const TS: usize = 5;
pub(super) const COLUMNS: usize = 6;
pub(super) const WIDTH: [usize; COLUMNS] = [4, 4, 4, 1, 8, 8];

/// A block not checked yet, checked and good, checked and bad.
const UNCHECKED: u8 = 0;
const GOOD: u8 = 1;
const BAD: u8 = 2;

/// Blocks of a column of `n` messages.
pub(super) fn blocks(n: usize) -> usize {
    n.div_ceil(BLOCK)
}

/// The snapshot's message columns, each block checked against its CRC
/// the first time it is read.
pub(super) struct Columns {
    map: Arc<Map>,
    n: usize,
    /// Where each column starts in the file.
    at: [usize; COLUMNS],
    /// Where the blocks' CRCs start: `COLUMNS * blocks(n)` u32, column
    /// after column.
    crcs: usize,
    nblocks: usize,
    checked: Vec<Cell<u8>>,
    /// Where each checked block's bytes are in memory (0: not fetched): a
    /// ranking reads a column value per posting, so the block is looked up
    /// once, not per value. Valid until [`Docs::release`], which clears it.
    fetched: Vec<Cell<usize>>,
    corrupt: Cell<bool>,
}

impl Columns {
    /// The columns of a snapshot whose sections were checked to lie in
    /// the file.
    pub(super) fn new(map: Arc<Map>, n: usize, at: [usize; COLUMNS], crcs: usize) -> Self {
        Columns {
            map,
            n,
            at,
            crcs,
            nblocks: blocks(n),
            checked: (0..COLUMNS * blocks(n))
                .map(|_| Cell::new(UNCHECKED))
                .collect(),
            fetched: (0..COLUMNS * blocks(n)).map(|_| Cell::new(0)).collect(),
            corrupt: Cell::new(false),
        }
    }

    /// Whether message `i`'s block of column `c` is good (checked now
    /// when it was not yet; a bad one marks the index corrupt).
    #[inline]
    fn good(&self, c: usize, i: usize) -> bool {
        let b = i / BLOCK;
        let k = c * self.nblocks + b;
        match self.checked.get(k).map(Cell::get) {
            Some(GOOD) => true,
            Some(UNCHECKED) => self.verify(c, b, k),
            _ => false,
        }
    }

    /// The `W` bytes of column `c` (of width `W`) of message `i`.
    #[inline]
    fn fixed<const W: usize>(&self, c: usize, i: usize) -> Option<[u8; W]> {
        if i >= self.n || WIDTH.get(c) != Some(&W) {
            return None;
        }
        let (b, k) = (i / BLOCK, c * self.nblocks + i / BLOCK);
        let at = match self.fetched.get(k)?.get() {
            0 => self.fetch(c, b, k)?,
            a => a,
        };
        let mut out = [0u8; W];
        // SAFETY: `at` is the address of block `b` of column `c` in the
        // map's memory, `min(n, (b + 1) * BLOCK) - b * BLOCK` values of `W`
        // bytes, read in and kept until `release` (which forgets `at`); `i`
        // is below `n` and in block `b`, so its `W` bytes lie inside.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (at as *const u8).add((i % BLOCK) * W),
                out.as_mut_ptr(),
                W,
            );
        }
        Some(out)
    }

    /// Check block `b` of column `c` (the `k`-th) and note where its bytes
    /// are: `None` when it fails its check.
    #[cold]
    fn fetch(&self, c: usize, b: usize, k: usize) -> Option<usize> {
        if !self.good(c, b * BLOCK) {
            return None;
        }
        let w = *WIDTH.get(c)?;
        let start = self
            .at
            .get(c)?
            .checked_add(b.checked_mul(BLOCK)?.checked_mul(w)?)?;
        let end = self
            .at
            .get(c)?
            .checked_add(self.n.min((b + 1) * BLOCK).checked_mul(w)?)?;
        let bytes = self.map.get(start..end)?;
        let at = bytes.as_ptr() as usize;
        self.fetched.get(k)?.set(at);
        Some(at)
    }

    fn u32_of(&self, c: usize, i: usize) -> Option<u32> {
        self.fixed::<4>(c, i).map(u32::from_le_bytes)
    }

    fn u64_of(&self, c: usize, i: usize) -> Option<u64> {
        self.fixed::<8>(c, i).map(u64::from_le_bytes)
    }

    /// Column `c` of message `i` as an integer; `None` (and the index
    /// marked corrupt) when its block fails its CRC.
    fn value(&self, c: usize, i: usize) -> Option<u64> {
        match WIDTH.get(c)? {
            1 => self.fixed::<1>(c, i).map(|b| u64::from(b[0])),
            4 => self.u32_of(c, i).map(u64::from),
            _ => self.u64_of(c, i),
        }
    }

    fn verify(&self, c: usize, b: usize, k: usize) -> bool {
        let w = WIDTH.get(c).copied().unwrap_or(0);
        let at = self.at.get(c).copied().unwrap_or(usize::MAX);
        let range = |from: usize, n: usize| {
            Some(at.checked_add(from.checked_mul(w)?)?..at.checked_add(n.checked_mul(w)?)?)
        };
        let data = range(b * BLOCK, self.n.min((b + 1) * BLOCK)).and_then(|r| self.map.get(r));
        let want = self
            .map
            .get(self.crcs + k * 4..self.crcs + k * 4 + 4)
            .and_then(|x| <[u8; 4]>::try_from(x).ok());
        let ok = matches!((data, want), (Some(d), Some(x)) if crc32fast::hash(d) == u32::from_le_bytes(x));
        if let Some(cell) = self.checked.get(k) {
            cell.set(if ok { GOOD } else { BAD });
        }
        if !ok {
            tracing::warn!("recall index: message column {c} block {b} fails its CRC");
            self.corrupt.set(true);
        }
        ok
    }

    fn role(&self, i: usize) -> Option<Role> {
        let r = role_of(self.value(ROLE, i)? as u8);
        if r.is_none() {
            self.corrupt.set(true);
        }
        r
    }
}

/// Every message the index holds, by doc id.
#[derive(Default)]
pub struct Docs {
    base: Option<Columns>,
    tail: Vec<DocMeta>,
}

impl Docs {
    pub(super) fn on(base: Columns) -> Self {
        Docs {
            base: Some(base),
            tail: Vec::new(),
        }
    }

    fn base_len(&self) -> usize {
        self.base.as_ref().map_or(0, |b| b.n)
    }

    pub fn len(&self) -> usize {
        self.base_len() + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn push(&mut self, d: DocMeta) {
        self.tail.push(d);
    }

    /// Whether a snapshot column failed its check.
    pub(super) fn corrupt(&self) -> bool {
        self.base.as_ref().is_some_and(|b| b.corrupt.get())
    }

    /// Where message `i` is: in the snapshot's columns, or the `Err` index
    /// of the tail.
    fn place(&self, i: usize) -> Result<&Columns, usize> {
        match &self.base {
            Some(b) if i < b.n => Ok(b),
            _ => Err(i - self.base_len()),
        }
    }

    /// Column `c` of message `i` as the snapshot stores it.
    pub(super) fn value(&self, c: usize, i: usize) -> Option<u64> {
        match self.place(i) {
            Ok(b) => b.value(c, i),
            Err(t) => {
                let d = self.tail.get(t)?;
                Some(match c {
                    CONV => u64::from(d.conv),
                    LEN => u64::from(d.len),
                    DL => u64::from(d.dl),
                    ROLE => u64::from(role_code(d.role)),
                    OFFSET => d.offset,
                    _ => d.ts as u64,
                })
            }
        }
    }

    pub fn get(&self, i: usize) -> Option<DocMeta> {
        match self.place(i) {
            Ok(b) => Some(DocMeta {
                conv: b.value(CONV, i)? as u32,
                offset: b.value(OFFSET, i)?,
                len: b.value(LEN, i)? as u32,
                ts: b.value(TS, i)? as i64,
                role: b.role(i)?,
                dl: b.value(DL, i)? as u32,
            }),
            Err(t) => self.tail.get(t).copied(),
        }
    }

    /// Tokens in message `i` (its BM25 length).
    pub fn dl(&self, i: usize) -> Option<u32> {
        match self.place(i) {
            Ok(b) => b.u32_of(DL, i),
            Err(t) => self.tail.get(t).map(|d| d.dl),
        }
    }

    pub fn ts(&self, i: usize) -> Option<i64> {
        match self.place(i) {
            Ok(b) => b.u64_of(TS, i).map(|v| v as i64),
            Err(t) => self.tail.get(t).map(|d| d.ts),
        }
    }

    pub fn conv(&self, i: usize) -> Option<u32> {
        match self.place(i) {
            Ok(b) => b.u32_of(CONV, i),
            Err(t) => self.tail.get(t).map(|d| d.conv),
        }
    }

    pub fn role(&self, i: usize) -> Option<Role> {
        match self.place(i) {
            Ok(b) => b.role(i),
            Err(t) => self.tail.get(t).map(|d| d.role),
        }
    }

    /// Let go of the snapshot bytes read so far.
    ///
    /// # Safety
    /// No slice of the snapshot may be alive (column values are copies).
    pub(super) unsafe fn release(&self) {
        if let Some(b) = &self.base {
            // What was fetched or checked is read (and checked) again.
            for f in &b.fetched {
                f.set(0);
            }
            for k in &b.checked {
                if k.get() == GOOD {
                    k.set(UNCHECKED);
                }
            }
            // SAFETY: passed on from our caller.
            unsafe { b.map.release() };
        }
    }
}
