//! A term's postings: doc ids, term frequencies and token positions, in
//! memory and as the snapshot stores them.

use super::codec::{put_varint, varint};

/// Entries of a posting list between two starts kept in `Postings::skip`.
const SKIP: usize = 64;

/// Postings of one term: doc ids ascending, with term frequencies and the
/// term's token positions in each doc.
#[derive(Debug, Default, Clone)]
pub struct Postings {
    pub docs: Vec<u32>,
    pub tfs: Vec<u16>,
    /// Positions, entry after entry (`tfs[j]` of them for entry `j`).
    pos: Vec<u32>,
    /// Where in `pos` entry `SKIP * i` starts (so an entry's positions are
    /// found without a start per entry).
    skip: Vec<u32>,
}

impl Postings {
    pub(super) fn push(&mut self, doc: u32, positions: &[u32]) {
        if self.docs.len().is_multiple_of(SKIP) {
            self.skip.push(self.pos.len() as u32);
        }
        self.docs.push(doc);
        self.tfs
            .push(u16::try_from(positions.len()).unwrap_or(u16::MAX));
        self.pos.extend_from_slice(positions);
    }

    /// The positions of entry `j`.
    pub fn positions(&self, j: usize) -> &[u32] {
        let block = j / SKIP;
        let Some(&base) = self.skip.get(block) else {
            return &[];
        };
        let before: usize = self
            .tfs
            .get(block * SKIP..j)
            .map_or(0, |t| t.iter().map(|&x| usize::from(x)).sum());
        let start = base as usize + before;
        let n = self.tfs.get(j).map_or(0, |&t| usize::from(t));
        self.pos.get(start..start + n).unwrap_or(&[])
    }
}

/// Whether the tokens whose postings are `seq` may occur one after the
/// other in doc `d`: false only when the positions rule it out.
pub(crate) fn may_be_consecutive(d: u32, seq: &[&Postings]) -> bool {
    let mut lists: Vec<&[u32]> = Vec::with_capacity(seq.len());
    for p in seq {
        let Ok(j) = p.docs.binary_search(&d) else {
            return false;
        };
        if p.tfs.get(j) == Some(&u16::MAX) {
            return true; // positions were capped: unknown
        }
        lists.push(p.positions(j));
    }
    let Some((first, rest)) = lists.split_first() else {
        return true;
    };
    first.iter().any(|&k| {
        rest.iter().enumerate().all(|(i, l)| {
            k.checked_add(i as u32 + 1)
                .is_some_and(|want| l.binary_search(&want).is_ok())
        })
    })
}

pub(super) fn encode_postings(out: &mut Vec<u8>, p: &Postings) {
    put_varint(out, p.docs.len() as u64);
    let mut prev = 0u32;
    for &d in &p.docs {
        put_varint(out, u64::from(d.wrapping_sub(prev)));
        prev = d;
    }
    for &tf in &p.tfs {
        put_varint(out, u64::from(tf));
    }
    for j in 0..p.docs.len() {
        let mut prev = 0u32;
        for &x in p.positions(j) {
            put_varint(out, u64::from(x.wrapping_sub(prev)));
            prev = x;
        }
    }
}

pub(super) fn decode_postings(b: &[u8], n_docs: usize) -> Option<Postings> {
    let mut at = 0;
    let n = varint(b, &mut at)?;
    // Each entry takes at least two bytes.
    if n > (b.len() / 2) as u64 {
        return None;
    }
    let n = n as usize;
    let mut docs = Vec::with_capacity(n);
    let mut d = 0u64;
    for i in 0..n {
        let delta = match b.get(at) {
            Some(&v) if v < 0x80 => {
                at += 1;
                u64::from(v)
            }
            _ => varint(b, &mut at)?,
        };
        if i > 0 && delta == 0 {
            return None;
        }
        d = d.checked_add(delta)?;
        if d >= n_docs as u64 {
            return None;
        }
        docs.push(d as u32);
    }
    let mut tfs = Vec::with_capacity(n);
    let mut total = 0usize;
    for _ in 0..n {
        let tf = u16::try_from(varint(b, &mut at)?).ok()?;
        total += usize::from(tf);
        tfs.push(tf);
    }
    // Each position takes at least a byte: no allocation past the input.
    if total > b.len().saturating_sub(at) {
        return None;
    }
    // Filled in place (this runs the first time a query meets a term).
    let mut pos = Vec::with_capacity(total);
    let mut skip = Vec::with_capacity(n / SKIP + 1);
    for (j, &tf) in tfs.iter().enumerate() {
        if j % SKIP == 0 {
            skip.push(pos.len() as u32);
        }
        let mut x = 0u32;
        for _ in 0..tf {
            let v = match b.get(at) {
                Some(&v) if v < 0x80 => {
                    at += 1;
                    u32::from(v)
                }
                _ => u32::try_from(varint(b, &mut at)?).ok()?,
            };
            x = x.checked_add(v)?;
            pos.push(x);
        }
    }
    (at == b.len()).then_some(Postings {
        docs,
        tfs,
        pos,
        skip,
    })
}
