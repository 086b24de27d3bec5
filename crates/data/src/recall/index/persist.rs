//! The index on disk: loading the logs (and the snapshot they continue),
//! cutting off a torn tail, appending batches, compacting.

use std::cell::OnceCell;
use std::fs::File;

use super::batch::{Batch, decode_batch, encode_batch};
use super::codec::{bytes, put_bytes, put_varint, varint};
use super::records::{BASE_TAG, append_record, base_gen, read_all, records};
use super::snapshot::SNAPSHOT_FILE_NAME;
use super::state::{Index, PERM};
use crate::paths::{RECALL_DOCS_FILE_NAME, RECALL_TERMS_FILE_NAME};
use crate::recall::error::{RecallError, fs, io};

/// The logs are compacted into a snapshot once they hold this many bytes
/// and a quarter of the snapshot's size (so compaction stays amortised).
const COMPACT_MIN_BYTES: u64 = 1 << 20;

/// The memory ([`Index::mem_cost`]) past which indexing compacts.
const FLUSH_COST: usize = 64 << 20;

impl Index {
    pub(super) fn clear(&mut self) -> Result<(), RecallError> {
        self.clear_memory();
        if let Some(f) = &self.files {
            self.persist = true;
            // The snapshot goes first: logs without a base record never
            // use it, but it would take space.
            match f.dir.remove_file(SNAPSHOT_FILE_NAME) {
                Err(e) if !e.is_not_found() => return Err(fs(e)),
                _ => {}
            }
            f.terms.set_len(0).map_err(io("recall terms log"))?;
            f.docs.set_len(0).map_err(io("recall docs log"))?;
        }
        Ok(())
    }

    /// The bytes of index log `name` (empty when missing).
    fn read_log(&self, name: &str) -> Result<Vec<u8>, RecallError> {
        if let Some(f) = &self.files {
            let file = if name == RECALL_TERMS_FILE_NAME {
                &f.terms
            } else {
                &f.docs
            };
            return read_all(file).map_err(io("recall index log"));
        }
        match self.open_index_file(name)? {
            Some(file) => read_all(&file).map_err(io("recall index file")),
            None => Ok(Vec::new()),
        }
    }

    /// Recall file `name`, opened for reading (`None` when missing).
    fn open_index_file(&self, name: &str) -> Result<Option<File>, RecallError> {
        let Some(dir) = self.files.as_ref().map(|f| &f.dir).or(self.ro_dir.as_ref()) else {
            return Ok(None);
        };
        match dir.open_file(name) {
            Ok((file, _)) => Ok(Some(file)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(fs(e)),
        }
    }

    pub(super) fn load(&mut self) -> Result<(), RecallError> {
        let terms = self.read_log(RECALL_TERMS_FILE_NAME)?;
        let docs = self.read_log(RECALL_DOCS_FILE_NAME)?;
        let (t_good, t_recs) = records(&terms);
        let (d_good, d_recs) = records(&docs);
        let t_base = t_recs.first().and_then(|r| base_gen(r));
        let d_base = d_recs.first().and_then(|r| base_gen(r));
        let skip = match (t_base, d_base) {
            (None, None) => {
                // The logs hold everything; a snapshot left by a crash
                // before the logs were replaced does not count.
                if let Some(f) = &self.files {
                    let _ = f.dir.remove_file(SNAPSHOT_FILE_NAME);
                }
                0
            }
            (Some(a), Some(b)) if a == b => {
                let loaded = match self.open_index_file(SNAPSHOT_FILE_NAME)? {
                    Some(file) => self.load_snapshot(&file, a),
                    None => false,
                };
                if !loaded {
                    return self.lost_state("its snapshot is missing or torn");
                }
                1
            }
            _ => return self.lost_state("its logs are of different generations"),
        };
        for payload in t_recs.iter().skip(skip) {
            let mut p = 0;
            let Some(n) = varint(payload, &mut p) else {
                break;
            };
            for _ in 0..n {
                let Some(term) = bytes(payload, &mut p).and_then(|b| std::str::from_utf8(b).ok())
                else {
                    break;
                };
                let id = self.postings.len() as u32;
                self.term_ids.insert(term.to_string(), id);
                self.postings.push(OnceCell::from(Box::default()));
            }
        }
        if (t_good as usize) < terms.len() {
            tracing::warn!("recall index: torn terms log cut at {t_good} bytes");
            if let Some(f) = &self.files {
                let _ = f.terms.set_len(t_good);
            }
        }
        drop(terms);
        let mut good = d_good;
        let mut at = 0u64;
        for (i, payload) in d_recs.iter().enumerate() {
            if i >= skip && !self.load_batch(payload) {
                good = at;
                break;
            }
            at += 8 + payload.len() as u64;
        }
        if (good as usize) < docs.len() {
            // A batch is decoded whole before it is applied, so nothing of
            // the bad one is in memory; what it covered is indexed again.
            tracing::warn!("recall index: docs log cut at {good} bytes");
            if let Some(f) = &self.files {
                f.docs.set_len(good).map_err(io("recall docs log"))?;
            }
        }
        Ok(())
    }

    /// The logs continue a snapshot that cannot be used: start afresh.
    fn lost_state(&mut self, why: &str) -> Result<(), RecallError> {
        tracing::warn!("recall index: {why}; rebuilding");
        self.clear()
    }

    /// Apply one docs batch; false (nothing applied) when it is invalid.
    fn load_batch(&mut self, payload: &[u8]) -> bool {
        match decode_batch(payload, self.postings.len() as u64) {
            Some(batch) => {
                self.apply(batch);
                true
            }
            None => false,
        }
    }

    pub(super) fn write_and_apply(&mut self, (new_terms, batch): (Vec<String>, Batch)) {
        if self.persist
            && let Err(e) = self.write(&new_terms, &batch)
        {
            tracing::warn!("recall index: not saved ({e}); it is rebuilt on the next open");
            self.persist = false;
        }
        self.apply(batch);
        if self.mem_cost > FLUSH_COST && self.persist && self.files.is_some() {
            if let Err(e) = self.compact() {
                tracing::warn!("recall index: not compacted ({e})");
            }
            // Failed or not, the next try waits for as much again.
            self.mem_cost = 0;
            self.flushed = true;
        }
    }

    fn write(&mut self, new_terms: &[String], batch: &Batch) -> std::io::Result<()> {
        let Some(f) = &mut self.files else {
            return Ok(());
        };
        if !new_terms.is_empty() {
            let mut p = Vec::new();
            put_varint(&mut p, new_terms.len() as u64);
            for t in new_terms {
                put_bytes(&mut p, t.as_bytes());
            }
            append_record(&mut f.terms, &p)?;
        }
        append_record(&mut f.docs, &encode_batch(batch))
    }

    /// Compact the logs into a snapshot when they have grown enough; a
    /// failure only leaves the logs as they are.
    pub(super) fn maybe_compact(&mut self) {
        let Some(f) = &self.files else {
            return;
        };
        if !self.persist {
            return;
        }
        let len = |f: &File| f.metadata().map(|m| m.len()).unwrap_or(0);
        let logs = len(&f.terms) + len(&f.docs);
        // After compacting while indexing, what followed is compacted too
        // (the next open then replays nothing).
        if logs < COMPACT_MIN_BYTES || !self.flushed && logs < self.snap.len() as u64 / 4 {
            return;
        }
        if let Err(e) = self.compact() {
            tracing::warn!("recall index: not compacted ({e})");
        }
        self.flushed = false;
    }

    /// Rebuild when a piece of the snapshot failed its check (what came
    /// from it cannot be trusted); a failed rebuild leaves the index
    /// marked, so a search fails rather than answers wrong.
    pub(super) fn repair(&mut self) {
        if self.corrupt() {
            tracing::warn!("recall index: the snapshot is corrupt; rebuilding");
            if let Err(e) = self.rebuild() {
                tracing::warn!("recall index: not rebuilt ({e})");
            }
        }
    }

    /// Write everything as a snapshot, then start both logs afresh on it.
    pub fn compact(&mut self) -> Result<(), RecallError> {
        if self.files.is_none() {
            return Ok(());
        }
        // A fresh generation, so logs never pair with another snapshot.
        let generation = rand::random::<u64>();
        let written = match &self.files {
            Some(f) => f
                .dir
                .replace_file_streamed(SNAPSHOT_FILE_NAME, PERM, |file| {
                    self.write_snapshot(file, generation)
                }),
            None => return Ok(()),
        };
        written.map_err(fs)?;
        let Some(f) = &mut self.files else {
            return Ok(());
        };
        // A crash from here until both logs are replaced leaves logs of
        // mixed generations or the old full logs: both are handled at open.
        let mut base = BASE_TAG.to_vec();
        base.extend_from_slice(&generation.to_le_bytes());
        let mut rec = Vec::with_capacity(20);
        rec.extend_from_slice(&(base.len() as u32).to_le_bytes());
        rec.extend_from_slice(&crc32fast::hash(&base).to_le_bytes());
        rec.extend_from_slice(&base);
        for name in [RECALL_DOCS_FILE_NAME, RECALL_TERMS_FILE_NAME] {
            f.dir.replace_file(name, &rec, PERM).map_err(fs)?;
        }
        f.terms = f
            .dir
            .open_append(RECALL_TERMS_FILE_NAME, PERM)
            .map_err(fs)?;
        f.docs = f.dir.open_append(RECALL_DOCS_FILE_NAME, PERM).map_err(fs)?;
        // Term ids are renumbered in the snapshot: take it as the state.
        let (file, _) = f.dir.open_file(SNAPSHOT_FILE_NAME).map_err(fs)?;
        if !self.load_snapshot(&file, generation) {
            return Err(RecallError::Invalid(
                "a recall snapshot just written does not read back".into(),
            ));
        }
        Ok(())
    }
}
