//! Catching up: indexing each conversation's log past the mark the index
//! covers, whole lines at a time, and rebuilding when the index is stale.

use super::batch::Batch;
use super::records::read_at_full;
use super::state::{Index, MAX_CONVERSATIONS};
use crate::paths::{MESSAGES_FILE_NAME, is_valid_agent_id};
use crate::recall::error::{RecallError, fs, io};

/// Largest conversation log indexed.
pub const MAX_LOG_BYTES: u64 = crate::store::conversation::MAX_LOG_BYTES;

/// Bytes of a conversation log read at once while catching up; a line
/// that does not fit in one (with its newline) is skipped: the lines the
/// conversation readers skip too.
const CHUNK: u64 = crate::store::conversation::lines::MAX_LINE_BYTES as u64 + 1;

impl Index {
    /// Index every conversation's messages past its high-water mark; rebuild
    /// when the index is stale (a log shorter than its mark, a
    /// conversation gone).
    pub(crate) fn catch_up(&mut self) -> Result<(), RecallError> {
        let ids = self.conversation_ids()?;
        let stale = self.convs.iter().any(|c| !ids.contains(&c.id));
        if stale {
            tracing::info!("recall index: a conversation is gone; rebuilding");
            self.clear()?;
        }
        for id in &ids {
            match self.catch_up_conversation(id) {
                Ok(()) => {}
                Err(RecallError::Stale) => {
                    tracing::info!("recall index: {id}'s log is shorter than indexed; rebuilding");
                    self.clear()?;
                    for id in &ids {
                        if let Err(e) = self.catch_up_conversation(id) {
                            tracing::warn!("recall index: conversation {id} not indexed: {e}");
                        }
                    }
                    return Ok(());
                }
                // One unreadable conversation does not stop the others.
                Err(e) => tracing::warn!("recall index: conversation {id} not indexed: {e}"),
            }
        }
        Ok(())
    }

    fn conversation_ids(&self) -> Result<Vec<String>, RecallError> {
        let Some(dir) = &self.convs_dir else {
            return Ok(Vec::new());
        };
        let mut ids: Vec<String> = dir
            .list(MAX_CONVERSATIONS)
            .map_err(fs)?
            .into_iter()
            .filter_map(|n| n.into_string().ok())
            .filter(|n| is_valid_agent_id(n))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Index conversation `id`'s log past its high-water mark (what its
    /// writer calls after an append).
    pub fn catch_up_conversation(&mut self, id: &str) -> Result<(), RecallError> {
        let covered = self
            .conv_ids
            .get(id)
            .and_then(|&n| self.convs.get(n as usize))
            .map_or(0, |c| c.covered);
        let Some(convs_dir) = &self.convs_dir else {
            return Ok(());
        };
        let dir = match convs_dir.open_dir(id) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(fs(e)),
        };
        let size = match dir.stat_at(MESSAGES_FILE_NAME).map_err(fs)? {
            Some(s) if s.kind == crate::agentfs::Kind::File => s.size,
            _ => 0,
        };
        if size < covered {
            return Err(RecallError::Stale);
        }
        if size == covered {
            return Ok(());
        }
        let (file, _) = dir.open_file(MESSAGES_FILE_NAME).map_err(fs)?;
        let end = size.min(MAX_LOG_BYTES);
        let mut pos = covered;
        let mut buf = Vec::new();
        while pos < end {
            let want = (end - pos).min(CHUNK) as usize;
            buf.resize(want, 0);
            let got = read_at_full(&file, &mut buf, pos).map_err(io("messages.jsonl"))?;
            buf.truncate(got);
            let Some(last_nl) = buf.iter().rposition(|b| *b == b'\n') else {
                if got < want {
                    break; // a torn last line: not a message yet
                }
                // A line longer than a chunk: skip to its end, if it has one.
                let mut skip = pos + got as u64;
                let mut found = None;
                while skip < end && found.is_none() {
                    let want = (end - skip).min(CHUNK) as usize;
                    buf.resize(want, 0);
                    let got = read_at_full(&file, &mut buf, skip).map_err(io("messages.jsonl"))?;
                    found = buf[..got].iter().position(|b| *b == b'\n');
                    skip += match found {
                        Some(i) => i as u64 + 1,
                        None => got.max(1) as u64,
                    };
                }
                if found.is_none() {
                    break;
                }
                tracing::warn!(
                    "recall index: {id}: a line over {} bytes skipped",
                    CHUNK - 1
                );
                let batch = Batch {
                    conv: id.to_string(),
                    covered: skip,
                    docs: Vec::new(),
                };
                self.write_and_apply((Vec::new(), batch));
                pos = skip;
                continue;
            };
            let chunk = &buf[..=last_nl];
            let batch = self.index_lines(id, pos, chunk);
            self.write_and_apply(batch);
            pos += chunk.len() as u64;
        }
        Ok(())
    }
}
