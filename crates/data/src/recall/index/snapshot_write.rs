//! Writing a snapshot (the layout is in `snapshot.rs`): front to back in
//! one pass, a term's postings at a time, so a compaction holds one
//! decoded posting list, the section tables and a write buffer — never
//! the file, and never the old snapshot's pages it has read (they are let
//! go as it goes).

use std::fs::File;
use std::io::Write;

use super::codec::{put_bytes, put_varint};
use super::docs::{BLOCK, COLUMNS, WIDTH};
use super::postings::{Postings, encode_postings};
use super::snapshot::Footer;
use super::state::Index;

/// Old snapshot bytes decoded between two releases of its pages.
const RELEASE_EVERY: usize = 16 << 20;

/// A buffered writer that counts what it wrote and, while `crc` is set,
/// checksums it.
struct Out<'a> {
    w: std::io::BufWriter<&'a mut File>,
    at: u64,
    crc: Option<crc32fast::Hasher>,
}

impl Out<'_> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.w.write_all(b)?;
        self.at += b.len() as u64;
        if let Some(h) = &mut self.crc {
            h.update(b);
        }
        Ok(())
    }

    fn pad8(&mut self) -> std::io::Result<()> {
        let n = (8 - (self.at % 8) as usize) % 8;
        self.put(&[0u8; 8][..n])
    }
}

fn corrupt() -> std::io::Error {
    std::io::Error::other("the recall snapshot being compacted is corrupt")
}

impl Index {
    /// Every term id, in the order of the terms' text: the snapshot's are
    /// sorted already, those added since are sorted and merged in.
    fn term_order(&self) -> Vec<u32> {
        let n = self.snap.n_terms;
        let mut names: Vec<&str> = vec![""; self.postings.len().saturating_sub(n as usize)];
        for (t, &id) in &self.term_ids {
            if let Some(slot) = id.checked_sub(n).and_then(|i| names.get_mut(i as usize)) {
                *slot = t;
            }
        }
        let mut new: Vec<u32> = (0..names.len() as u32).collect();
        new.sort_unstable_by_key(|&i| names.get(i as usize).copied().unwrap_or(""));
        let mut order = Vec::with_capacity(self.postings.len());
        let mut new = new.into_iter().peekable();
        for old in 0..n {
            let text = self.snap.term(old).unwrap_or(b"");
            while let Some(&i) = new.peek() {
                if names
                    .get(i as usize)
                    .map_or(b"".as_slice(), |s| s.as_bytes())
                    >= text
                {
                    break;
                }
                order.push(n + i);
                new.next();
            }
            order.push(old);
        }
        order.extend(new.map(|i| n + i));
        order
    }

    /// The text of term `id` (`order` names every id once).
    fn term_text<'a>(&'a self, id: u32, new_names: &'a [&'a str]) -> &'a [u8] {
        match id.checked_sub(self.snap.n_terms) {
            None => self.snap.term(id).unwrap_or(b""),
            Some(i) => new_names.get(i as usize).map_or(b"", |s| s.as_bytes()),
        }
    }

    /// Term `id`'s postings as they stand, decoded for this write only
    /// when not decoded yet; `None` when the snapshot's fail their check.
    fn postings_for_write(&self, id: u32) -> Option<std::borrow::Cow<'_, Postings>> {
        if let Some(p) = self.postings.get(id as usize).and_then(|c| c.get()) {
            return Some(std::borrow::Cow::Borrowed(p));
        }
        let mut p = self.snap.postings(id, self.docs.len())?;
        if let Some(tail) = self.pending.get(&id) {
            for (j, &d) in tail.docs.iter().enumerate() {
                p.push(d, tail.positions(j));
            }
        }
        Some(std::borrow::Cow::Owned(p))
    }

    /// Write the whole state to `file` as a snapshot of generation
    /// `generation`; an error when the snapshot it continues fails a check.
    pub(super) fn write_snapshot(&self, file: &mut File, generation: u64) -> std::io::Result<()> {
        let mut w = Out {
            w: std::io::BufWriter::with_capacity(1 << 20, file),
            at: 0,
            crc: None,
        };
        let order = self.term_order();
        // Postings, term after term.
        let mut offs: Vec<u64> = Vec::with_capacity(order.len() + 1);
        let mut buf = Vec::new();
        let mut read = 0usize;
        for &id in &order {
            offs.push(w.at);
            // A snapshot term nothing was added to is copied as stored
            // (its CRC with it, so damage stays detectable).
            let untouched = id < self.snap.n_terms
                && !self.pending.contains_key(&id)
                && self
                    .postings
                    .get(id as usize)
                    .is_some_and(|c| c.get().is_none());
            if let Some(raw) = self.snap.stored(id).filter(|_| untouched) {
                w.put(raw)?;
                read += raw.len();
                continue;
            }
            buf.clear();
            buf.extend_from_slice(&[0u8; 4]);
            let p = self.postings_for_write(id).ok_or_else(corrupt)?;
            encode_postings(&mut buf, &p);
            let crc = crc32fast::hash(buf.get(4..).unwrap_or(&[]));
            buf[..4].copy_from_slice(&crc.to_le_bytes());
            w.put(&buf)?;
            read += buf.len();
            if read > RELEASE_EVERY {
                // SAFETY: `raw` and every other slice of the snapshot ended
                // with the iteration that copied it out.
                unsafe { self.snap.release() };
                read = 0;
            }
        }
        offs.push(w.at);
        let mut f = Footer {
            generation,
            n_terms: order.len() as u64,
            n_docs: self.docs.len() as u64,
            post_table: w.at,
            ..Footer::default()
        };
        for o in &offs {
            w.put(&o.to_le_bytes())?;
        }
        drop(offs);
        self.write_tables(&mut w, &order, &mut f)?;
        self.write_columns(&mut w, &mut f)?;
        let mut foot = f.encode();
        w.put(&foot)?;
        let crc = w.crc.take().map_or(0, |h| h.finalize());
        foot.clear();
        foot.extend_from_slice(&crc.to_le_bytes());
        foot.extend_from_slice(&[0u8; 4]);
        w.put(&foot)?;
        w.w.flush()
    }

    /// The term offsets and text, and the conversation table (checksummed
    /// from here on).
    fn write_tables(&self, w: &mut Out<'_>, order: &[u32], f: &mut Footer) -> std::io::Result<()> {
        let n = self.snap.n_terms;
        let mut new_names: Vec<&str> = vec![""; self.postings.len().saturating_sub(n as usize)];
        for (t, &id) in &self.term_ids {
            if let Some(slot) = id
                .checked_sub(n)
                .and_then(|i| new_names.get_mut(i as usize))
            {
                *slot = t;
            }
        }
        w.crc = Some(crc32fast::Hasher::new());
        f.term_offs = w.at;
        let mut len = 0u32;
        w.put(&len.to_le_bytes())?;
        for &id in order {
            len = len.saturating_add(self.term_text(id, &new_names).len() as u32);
            w.put(&len.to_le_bytes())?;
        }
        f.term_blob = w.at;
        for &id in order {
            w.put(self.term_text(id, &new_names))?;
        }
        // SAFETY: each term's text was written out by the loop that read it.
        unsafe { self.snap.release() };
        f.convs = w.at;
        let mut t = Vec::new();
        put_varint(&mut t, self.convs.len() as u64);
        for c in &self.convs {
            put_bytes(&mut t, c.id.as_bytes());
            put_varint(&mut t, c.covered);
        }
        w.put(&t)?;
        w.pad8()
    }

    /// The message columns (each block's CRC kept for the table after
    /// them, which the footer's CRC covers).
    fn write_columns(&self, w: &mut Out<'_>, f: &mut Footer) -> std::io::Result<()> {
        let table = w.crc.take();
        let n = self.docs.len();
        let mut crcs = Vec::new();
        let mut block = Vec::with_capacity(BLOCK * 8);
        for (c, &width) in WIDTH.iter().enumerate().take(COLUMNS) {
            f.cols[c] = w.at;
            for i in 0..n {
                let v = self.docs.value(c, i).ok_or_else(corrupt)?;
                block.extend_from_slice(v.to_le_bytes().get(..width).unwrap_or(&[]));
                if (i + 1) % BLOCK == 0 || i + 1 == n {
                    crcs.push(crc32fast::hash(&block));
                    w.put(&block)?;
                    block.clear();
                }
            }
            w.pad8()?;
            // SAFETY: the columns were read as copied values only.
            unsafe { self.docs.release() };
        }
        w.crc = table;
        f.crcs = w.at;
        for c in crcs {
            w.put(&c.to_le_bytes())?;
        }
        Ok(())
    }
}
