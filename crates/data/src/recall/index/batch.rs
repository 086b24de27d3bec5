//! A docs batch: complete lines of one conversation's log tokenised into
//! messages with their terms and positions, encoded as a docs-log record,
//! decoded again, and applied to the index in memory.

use std::cell::OnceCell;

use super::codec::{bytes, put_bytes, put_varint, role_code, role_of, unzigzag, varint, zigzag};
use super::docs::DocMeta;
use super::state::Index;
use crate::paths::is_valid_agent_id;
use crate::protocol::messages::Role;
use crate::recall::tokenize::{normalize, tokens_normalized};
use crate::store::conversation::StoredMessage;

/// The first byte of a docs batch (older batches started otherwise).
const BATCH_MARK: u8 = 0;

/// About the bytes a term kept in memory costs (its name in the map, its
/// postings' box and vectors).
const TERM_COST: usize = 160;

impl Index {
    pub(super) fn apply(&mut self, batch: Batch) {
        let conv = self.conv_number(&batch.conv);
        if let Some(c) = self.convs.get_mut(conv as usize) {
            c.covered = c.covered.max(batch.covered);
        }
        for d in batch.docs {
            let id = self.docs.len() as u32;
            let mut dl = 0u32;
            let mut at = 0usize;
            for &(t, tf) in &d.terms {
                let end = at + usize::from(tf);
                let positions = d.pos.get(at..end).unwrap_or(&[]);
                at = end;
                let Some(cell) = self.postings.get_mut(t as usize) else {
                    continue;
                };
                match cell.get_mut() {
                    Some(p) => {
                        p.push(id, positions);
                        if !self.pending.is_empty() {
                            self.pending.remove(&t);
                        }
                    }
                    None => {
                        let p = self.pending.entry(t).or_default();
                        if p.docs.is_empty() {
                            self.mem_cost += TERM_COST;
                        }
                        p.push(id, positions);
                    }
                }
                // A doc id, a tf, the positions (and what vectors leave
                // spare as they grow).
                self.mem_cost += 8 + 6 * positions.len();
                dl = dl.saturating_add(u32::from(tf));
            }
            self.mem_cost += std::mem::size_of::<DocMeta>();
            self.docs.push(DocMeta {
                conv,
                offset: d.offset,
                len: d.len,
                ts: d.ts,
                role: d.role,
                dl,
            });
        }
    }

    /// Tokenise complete lines starting at byte `base` of conversation
    /// `conv`'s log into a batch (new terms get ids here).
    pub(super) fn index_lines(
        &mut self,
        conv: &str,
        base: u64,
        chunk: &[u8],
    ) -> (Vec<String>, Batch) {
        let mut new_terms = Vec::new();
        let mut docs = Vec::new();
        let mut start = 0usize;
        // (term id << 32 | position) of every token: sorted, they group
        // by term with positions ascending.
        let mut occ: Vec<u64> = Vec::new();
        for (i, b) in chunk.iter().enumerate() {
            if *b != b'\n' {
                continue;
            }
            let line = &chunk[start..i];
            let offset = base + start as u64;
            start = i + 1;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let Ok(msg) = serde_json::from_slice::<StoredMessage>(line) else {
                continue;
            };
            let text = normalize(&searchable_text(&msg));
            occ.clear();
            let mut n = 0u32;
            tokens_normalized(&text, |t| {
                let id = match self.term_ids.get(t) {
                    Some(&id) => id,
                    None => match self.snap.find(t) {
                        Some(id) => {
                            self.term_ids.insert(t.to_string(), id);
                            self.mem_cost += TERM_COST;
                            id
                        }
                        None => {
                            self.mem_cost += TERM_COST;
                            let id = self.postings.len() as u32;
                            self.term_ids.insert(t.to_string(), id);
                            self.postings.push(OnceCell::from(Box::default()));
                            new_terms.push(t.to_string());
                            id
                        }
                    },
                };
                occ.push(u64::from(id) << 32 | u64::from(n));
                n = n.saturating_add(1);
            });
            occ.sort_unstable();
            let mut terms: Vec<(u32, u16)> = Vec::new();
            let mut pos: Vec<u32> = Vec::with_capacity(occ.len());
            for &o in &occ {
                let (id, p) = ((o >> 32) as u32, o as u32);
                match terms.last_mut() {
                    Some((t, tf)) if *t == id => {
                        // Past the cap the count stops and so do positions.
                        if *tf < u16::MAX {
                            *tf += 1;
                            pos.push(p);
                        }
                    }
                    _ => {
                        terms.push((id, 1));
                        pos.push(p);
                    }
                }
            }
            docs.push(Doc {
                offset,
                len: u32::try_from(line.len()).unwrap_or(u32::MAX),
                ts: parse_ts(&msg.ts),
                role: msg.role,
                terms,
                pos,
            });
        }
        (
            new_terms,
            Batch {
                conv: conv.to_string(),
                covered: base + chunk.len() as u64,
                docs,
            },
        )
    }
}

/// The text of a message that recall searches and shows: what was said
/// ([`crate::store::conversation::said::said`]).
pub fn searchable_text(msg: &StoredMessage) -> String {
    crate::store::conversation::said::said(msg)
}

/// Unix seconds of an RFC 3339 time; 0 when unparsable.
pub fn parse_ts(ts: &str) -> i64 {
    crate::clock::parse_rfc3339(ts).map_or(0, |t| t.unix_timestamp())
}

pub(super) struct Doc {
    offset: u64,
    len: u32,
    ts: i64,
    role: Role,
    terms: Vec<(u32, u16)>,
    /// Each term's positions in turn (`tf` of them).
    pos: Vec<u32>,
}

pub(super) struct Batch {
    pub(super) conv: String,
    pub(super) covered: u64,
    pub(super) docs: Vec<Doc>,
}

pub(super) fn encode_batch(b: &Batch) -> Vec<u8> {
    let mut p = Vec::with_capacity(64 + b.docs.len() * 96);
    p.push(BATCH_MARK);
    put_bytes(&mut p, b.conv.as_bytes());
    put_varint(&mut p, b.covered);
    put_varint(&mut p, b.docs.len() as u64);
    for d in &b.docs {
        put_varint(&mut p, d.offset);
        put_varint(&mut p, u64::from(d.len));
        p.push(role_code(d.role));
        put_varint(&mut p, zigzag(d.ts));
        put_varint(&mut p, d.terms.len() as u64);
        let mut prev = 0u32;
        let mut at = 0usize;
        for &(t, tf) in &d.terms {
            put_varint(&mut p, u64::from(t - prev));
            put_varint(&mut p, u64::from(tf));
            prev = t;
            let end = at + usize::from(tf);
            let mut last = 0u32;
            for &x in d.pos.get(at..end).unwrap_or(&[]) {
                put_varint(&mut p, u64::from(x.wrapping_sub(last)));
                last = x;
            }
            at = end;
        }
    }
    p
}

pub(super) fn decode_batch(p: &[u8], n_terms: u64) -> Option<Batch> {
    if p.first() != Some(&BATCH_MARK) {
        return None;
    }
    let mut at = 1;
    let conv = std::str::from_utf8(bytes(p, &mut at)?).ok()?;
    if !is_valid_agent_id(conv) {
        return None;
    }
    let covered = varint(p, &mut at)?;
    let n = varint(p, &mut at)?;
    let mut docs = Vec::with_capacity(n.min(1 << 16) as usize);
    for _ in 0..n {
        let offset = varint(p, &mut at)?;
        let len = u32::try_from(varint(p, &mut at)?).ok()?;
        let role = role_of(*p.get(at)?)?;
        at += 1;
        let ts = unzigzag(varint(p, &mut at)?);
        let nt = varint(p, &mut at)?;
        let mut terms = Vec::with_capacity(nt.min(1 << 16) as usize);
        let mut pos = Vec::new();
        let mut t = 0u64;
        for i in 0..nt {
            let delta = varint(p, &mut at)?;
            // Ids strictly ascend: a repeat would double a posting.
            if i > 0 && delta == 0 {
                return None;
            }
            t = t.checked_add(delta)?;
            if t >= n_terms {
                return None;
            }
            let tf = u16::try_from(varint(p, &mut at)?).ok()?;
            let mut x = 0u32;
            for _ in 0..tf {
                x = x.checked_add(u32::try_from(varint(p, &mut at)?).ok()?)?;
                pos.push(x);
            }
            terms.push((t as u32, tf));
        }
        docs.push(Doc {
            offset,
            len,
            ts,
            role,
            terms,
            pos,
        });
    }
    (at == p.len()).then(|| Batch {
        conv: conv.to_string(),
        covered,
        docs,
    })
}
