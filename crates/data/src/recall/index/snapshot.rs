//! The compacted index, `snapshot-v2.bin`: written whole from the state
//! in memory, checked and indexed when loaded (its postings decoded only
//! when a query or an append touches them).

use std::cell::OnceCell;

use super::codec::{bytes, put_bytes, put_varint, role_code, role_of, unzigzag, varint, zigzag};
use super::postings::{Postings, decode_postings, encode_postings};
use super::state::{DocMeta, Index, MAX_CONVERSATIONS, Snapshot};
use crate::paths::is_valid_agent_id;

/// The compacted index.
pub const SNAPSHOT_FILE_NAME: &str = "snapshot-v2.bin";
const SNAPSHOT_MAGIC: &[u8; 8] = b"MLRECAL2";

impl Snapshot {
    fn u32_at(&self, at: usize) -> Option<u32> {
        let b = self.bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64_at(&self, at: usize) -> Option<u64> {
        let b = self.bytes.get(at..at + 8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }

    /// The text of snapshot term `i`.
    fn term(&self, i: u32) -> Option<&[u8]> {
        let at = self.term_offs + i as usize * 4;
        let (s, e) = (self.u32_at(at)? as usize, self.u32_at(at + 4)? as usize);
        self.bytes
            .get(self.term_blob.checked_add(s)?..self.term_blob.checked_add(e)?)
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

    /// The postings of snapshot term `i` (empty when undecodable: the CRC
    /// held, so only a forged file gets here).
    pub(super) fn postings(&self, i: u32, n_docs: usize) -> Postings {
        let at = self.post_offs + i as usize * 8;
        let range = self.u64_at(at).zip(self.u64_at(at + 8)).and_then(|(s, e)| {
            let s = self.post_blob.checked_add(usize::try_from(s).ok()?)?;
            let e = self.post_blob.checked_add(usize::try_from(e).ok()?)?;
            self.bytes.get(s..e)
        });
        range
            .and_then(|b| decode_postings(b, n_docs))
            .unwrap_or_default()
    }
}

impl Index {
    /// Take `bytes` as the snapshot of generation `generation`; false (nothing
    /// changed) when it is not a whole snapshot of that generation.
    pub(super) fn load_snapshot(&mut self, bytes: Vec<u8>, generation: u64) -> bool {
        match parse_snapshot(bytes, generation) {
            Some((snap, convs, docs)) => {
                self.clear_memory();
                self.postings = (0..snap.n_terms).map(|_| OnceCell::new()).collect();
                self.snap = snap;
                for (id, covered) in convs {
                    let n = self.conv_number(&id);
                    if let Some(c) = self.convs.get_mut(n as usize) {
                        c.covered = covered;
                    }
                }
                self.dls = docs.iter().map(|d| d.dl).collect();
                self.docs = docs;
                true
            }
            None => false,
        }
    }

    /// The whole state as a snapshot of generation `generation`: header, terms
    /// (sorted, so a term is found by binary search), postings (an offset
    /// per term, so each decodes alone), conversations, messages; a CRC of
    /// all of it at the end.
    pub(super) fn encode_snapshot(&self, generation: u64) -> Vec<u8> {
        let mut names: Vec<(&[u8], u32)> = Vec::with_capacity(self.postings.len());
        for i in 0..self.snap.n_terms {
            names.push((self.snap.term(i).unwrap_or(b""), i));
        }
        for (t, &id) in &self.term_ids {
            if id >= self.snap.n_terms {
                names.push((t.as_bytes(), id));
            }
        }
        names.sort_unstable();
        let mut out = Vec::with_capacity(self.snap.bytes.len() + (1 << 20));
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&generation.to_le_bytes());
        out.extend_from_slice(&(names.len() as u32).to_le_bytes());
        let mut blob_len = 0u32;
        out.extend_from_slice(&0u32.to_le_bytes());
        for (t, _) in &names {
            blob_len = blob_len.saturating_add(t.len() as u32);
            out.extend_from_slice(&blob_len.to_le_bytes());
        }
        for (t, _) in &names {
            out.extend_from_slice(t);
        }
        let mut blob = Vec::new();
        let mut offs = Vec::with_capacity((names.len() + 1) * 8);
        offs.extend_from_slice(&0u64.to_le_bytes());
        for &(_, id) in &names {
            if let Some(p) = self.postings_at(id) {
                encode_postings(&mut blob, p);
            }
            offs.extend_from_slice(&(blob.len() as u64).to_le_bytes());
        }
        out.extend_from_slice(&offs);
        out.extend_from_slice(&(blob.len() as u64).to_le_bytes());
        out.extend_from_slice(&blob);
        drop(blob);
        put_varint(&mut out, self.convs.len() as u64);
        for c in &self.convs {
            put_bytes(&mut out, c.id.as_bytes());
            put_varint(&mut out, c.covered);
        }
        put_varint(&mut out, self.docs.len() as u64);
        for d in &self.docs {
            put_varint(&mut out, u64::from(d.conv));
            put_varint(&mut out, d.offset);
            put_varint(&mut out, u64::from(d.len));
            out.push(role_code(d.role));
            put_varint(&mut out, zigzag(d.ts));
            put_varint(&mut out, u64::from(d.dl));
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}

type SnapshotParts = (Snapshot, Vec<(String, u64)>, Vec<DocMeta>);

/// Check and index a snapshot's bytes (the postings stay encoded).
fn parse_snapshot(bytes: Vec<u8>, want_generation: u64) -> Option<SnapshotParts> {
    let body_len = bytes.len().checked_sub(4)?;
    let (body, crc) = bytes.split_at(body_len);
    if crc32fast::hash(body).to_le_bytes() != crc || !body.starts_with(SNAPSHOT_MAGIC) {
        return None;
    }
    let mut s = Snapshot {
        bytes: Vec::new(),
        ..Snapshot::default()
    };
    let mut at = SNAPSHOT_MAGIC.len();
    let fixed = |at: &mut usize, n: usize| -> Option<&[u8]> {
        let b = body.get(*at..at.checked_add(n)?)?;
        *at += n;
        Some(b)
    };
    s.generation = u64::from_le_bytes(fixed(&mut at, 8)?.try_into().ok()?);
    if s.generation != want_generation {
        return None;
    }
    s.n_terms = u32::from_le_bytes(fixed(&mut at, 4)?.try_into().ok()?);
    let n = s.n_terms as usize;
    s.term_offs = at;
    let offs = fixed(&mut at, n.checked_add(1)?.checked_mul(4)?)?;
    let blob_len = u32::from_le_bytes(offs.get(n * 4..)?.try_into().ok()?) as usize;
    s.term_blob = at;
    fixed(&mut at, blob_len)?;
    s.post_offs = at;
    fixed(&mut at, n.checked_add(1)?.checked_mul(8)?)?;
    let post_len = u64::from_le_bytes(fixed(&mut at, 8)?.try_into().ok()?);
    s.post_blob = at;
    fixed(&mut at, usize::try_from(post_len).ok()?)?;
    let n_convs = varint(body, &mut at)?;
    if n_convs > MAX_CONVERSATIONS as u64 {
        return None;
    }
    let mut convs = Vec::with_capacity(n_convs as usize);
    for _ in 0..n_convs {
        let id = std::str::from_utf8(self::bytes(body, &mut at)?).ok()?;
        if !is_valid_agent_id(id) {
            return None;
        }
        convs.push((id.to_string(), varint(body, &mut at)?));
    }
    let n_docs = varint(body, &mut at)?;
    // Each message takes at least six bytes: no allocation past the file.
    if n_docs > (body.len() / 6) as u64 {
        return None;
    }
    let mut docs = Vec::with_capacity(n_docs as usize);
    for _ in 0..n_docs {
        let conv = u32::try_from(varint(body, &mut at)?).ok()?;
        if conv as usize >= convs.len() {
            return None;
        }
        let offset = varint(body, &mut at)?;
        let len = u32::try_from(varint(body, &mut at)?).ok()?;
        let role = role_of(*body.get(at)?)?;
        at += 1;
        let ts = unzigzag(varint(body, &mut at)?);
        let dl = u32::try_from(varint(body, &mut at)?).ok()?;
        docs.push(DocMeta {
            conv,
            offset,
            len,
            ts,
            role,
            dl,
        });
    }
    if at != body.len() {
        return None;
    }
    s.bytes = bytes;
    Some((s, convs, docs))
}
