//! The persistent inverted index of one agent's conversations, in
//! `conversations/.recall/` (the agent child may write it: its profile
//! grants `$AGENT/conversations`).
//!
//! Two append-only logs of records, each `[u32 length][u32 CRC-32][payload]`
//! (little-endian):
//!
//! * `terms-v3.log` — batches of new terms; a term's id is its position
//!   (after the snapshot's terms, when there is one).
//! * `docs-v3.log` — batches of indexed messages of one conversation (a
//!   payload starts with a 0 byte, the format mark): the conversation id,
//!   the byte length of its `messages.jsonl` the batch covers (the
//!   high-water mark), then per message its line's offset and length,
//!   role, time and `(term id, tf, positions)` (ids and positions
//!   delta-coded).
//!
//! and `snapshot-v3.bin`, the compacted state: when the logs grow past a
//! threshold (or the postings indexed since the snapshot take too much
//! memory), everything is written as one file, front to back, and renamed
//! over the old one; then each log is replaced by a single *base* record
//! naming the snapshot's generation. Opening reads (`map.rs`: by `pread`, on
//! demand, never a mapping of the file an agent's child could truncate
//! under a reader) and checks
//! only its footer and the small tables a lookup needs (terms,
//! conversations) against their CRC; a term's postings are checked
//! against their own CRC and decoded the first time a query (or an
//! append) touches them, and the messages' fixed-width columns are read in
//! place, a block checked the first time it is read — so a one-shot search
//! pays for the chunks it reads, not for the index (layout in
//! `snapshot.rs`). A piece that fails its check marks the index corrupt:
//! the search is answered again after a rebuild (in memory when
//! read-only), never from the bad piece. The logs are replayed on top.
//! The logs decide which snapshot counts: both starting with the base
//! record of the snapshot's generation means "snapshot + these records";
//! no base record means the logs hold everything (a crash between writing
//! a snapshot and replacing the logs — the snapshot is ignored); anything
//! else (a torn snapshot, mixed generations) means state is missing and
//! the index is rebuilt. The files of an earlier format are deleted on
//! open and the index is rebuilt in this one.
//!
//! Token positions: each posting keeps the positions (token numbers) of the
//! term in the message, so a quoted phrase is checked against the index —
//! its tokens at consecutive positions — before any message is re-read.
//! That check is necessary, not sufficient (punctuation and word
//! boundaries are not tokens), so the final answer still comes from the
//! text of the few messages shown, and results do not change. Positions
//! were chosen over keeping a normalised copy of the text: they cost about
//! one byte per token (a copy costs the text itself, which would take the
//! index past the messages' size) and the check is a few binary searches.
//!
//! A record that is torn, fails its checksum or names an unknown term or a
//! conversation id that is not valid ends the log: it is cut off there and
//! what it covered is indexed again. Then the index *catches up*: each
//! conversation's log past its high-water mark is indexed (complete lines
//! only), so a query never sees a stale index; a log shorter than its
//! mark, or a conversation gone, means the index is stale and is rebuilt.
//! Writers hold `lock` (flock), so two processes never append at once. The
//! message text is not kept: results re-read their line from
//! `messages.jsonl`.
//!
//! [`Index::open_read_only`] is for a view that cannot be written: it
//! creates, locks and writes nothing, and catches up in memory only. It
//! takes no lock (a read-only view may not allow one), which is safe: every
//! write is an append of a whole record or an atomic rename, and a reader
//! that sees a torn tail or a generation change just indexes more itself.

//!
//! The parts: `postings.rs` (a term's postings and their encoding),
//! `codec.rs` (varints and the other byte forms), `state.rs` (the
//! [`Index`] and what it holds), `docs.rs` (the messages, in the
//! snapshot's columns and after), `records.rs` (the logs'
//! checksummed records), `batch.rs` (a docs batch: messages tokenised,
//! encoded, applied), `snapshot.rs` (the compacted file, read in place),
//! `snapshot_write.rs` (writing it), `map.rs` (the file's bytes read in on demand), `persist.rs`
//! (loading, appending, compacting) and `catch_up.rs` (indexing what the
//! conversation logs gained).

mod batch;
mod catch_up;
mod codec;
mod docs;
mod map;
mod persist;
mod postings;
mod records;
mod snapshot;
mod snapshot_write;
mod state;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use super::error::{RecallError, fs, io};
use crate::agentfs::Dir;
use crate::paths::{
    AgentPaths, CONVERSATIONS_DIR_NAME, MESSAGES_FILE_NAME, RECALL_DIR_NAME, RECALL_DOCS_FILE_NAME,
    RECALL_LOCK_FILE_NAME, RECALL_TERMS_FILE_NAME,
};
use crate::store::conversation::StoredMessage;

pub use batch::{parse_ts, searchable_text};
pub use catch_up::MAX_LOG_BYTES;
pub use docs::{DocMeta, Docs};
pub use postings::Postings;
pub(crate) use postings::may_be_consecutive;
pub use records::MAX_INDEX_BYTES;
pub use snapshot::SNAPSHOT_FILE_NAME;
pub use state::Index;
use state::{ConvState, Files, PERM, Snapshot};

/// How long opening waits for another holder of the index.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How an index on disk stands against the logs ([`Index::lag`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lag {
    /// Log bytes not indexed yet (the next search catches up).
    pub behind_bytes: u64,
    /// Conversations whose log is shorter than the index says it covered
    /// (truncated or replaced): their entries no longer match the log.
    pub stale: Vec<String>,
}

/// The conversations directory of `agent` (made when missing).
pub(crate) fn conversations_dir(agent: &AgentPaths) -> Result<Dir, RecallError> {
    match Dir::open(&agent.conversations_dir()) {
        Ok(d) => Ok(d),
        Err(e) if e.is_not_found() => Dir::open(agent.dir())
            .and_then(|a| a.create_dir(CONVERSATIONS_DIR_NAME, 0o777))
            .map_err(fs),
        Err(e) => Err(fs(e)),
    }
}

impl Index {
    /// Open (creating) the index of `agent`, repair what a crash left, and
    /// catch up with every conversation.
    pub fn open(agent: &AgentPaths) -> Result<Self, RecallError> {
        let mut index = Self::open_only(agent)?;
        index.catch_up()?;
        index.maybe_compact();
        index.repair();
        Ok(index)
    }

    /// Open and load without catching up.
    pub fn open_only(agent: &AgentPaths) -> Result<Self, RecallError> {
        let convs_dir = conversations_dir(agent)?;
        let dir = convs_dir.create_dir(RECALL_DIR_NAME, 0o755).map_err(fs)?;
        let lock = lock(dir.open_append(RECALL_LOCK_FILE_NAME, PERM).map_err(fs)?)
            .map_err(io("recall index lock"))?;
        // An index of an earlier format is rebuilt in this one: its
        // files are dead weight (the messages are what counts).
        for old in crate::paths::RECALL_OLD_FILE_NAMES {
            let _ = dir.remove_file(old);
        }
        let terms = dir.open_append(RECALL_TERMS_FILE_NAME, PERM).map_err(fs)?;
        let docs = dir.open_append(RECALL_DOCS_FILE_NAME, PERM).map_err(fs)?;
        let mut index = Self::empty(Some(convs_dir));
        index.files = Some(Files {
            dir,
            _lock: lock,
            terms,
            docs,
        });
        index.persist = true;
        index.load()?;
        Ok(index)
    }

    /// Open `agent`'s index without writing anything: what is on disk is
    /// loaded (nothing when it is missing or unreadable) and caught up in
    /// memory only.
    pub fn open_read_only(agent: &AgentPaths) -> Result<Self, RecallError> {
        let convs_dir = match Dir::open(&agent.conversations_dir()) {
            Ok(d) => Some(d),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(fs(e)),
        };
        let mut index = Self::empty(None);
        index.ro_dir = convs_dir
            .as_ref()
            .and_then(|d| d.open_dir(RECALL_DIR_NAME).ok());
        index.convs_dir = convs_dir;
        if let Err(e) = index.load() {
            // Whatever could not be read is indexed in memory instead.
            tracing::warn!("recall index: not loaded ({e}); indexing in memory");
            index.clear()?;
        }
        index.catch_up()?;
        Ok(index)
    }

    /// How the index on disk stands against `agent`'s conversation logs,
    /// read without writing or catching up anything (for `doctor`): `None`
    /// when there is no index.
    pub fn lag(agent: &AgentPaths) -> Result<Option<Lag>, RecallError> {
        let convs_dir = match Dir::open(&agent.conversations_dir()) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(fs(e)),
        };
        let Ok(ro) = convs_dir.open_dir(RECALL_DIR_NAME) else {
            return Ok(None);
        };
        let mut index = Self::empty(None);
        index.ro_dir = Some(ro);
        index.load()?;
        let mut lag = Lag::default();
        for id in crate::store::conversation::list_ids(agent)? {
            let covered = index
                .conv_ids
                .get(&id)
                .and_then(|&n| index.convs.get(n as usize))
                .map_or(0, |c| c.covered);
            let size = match convs_dir.open_dir(&id) {
                Ok(dir) => match dir.stat_at(MESSAGES_FILE_NAME).map_err(fs)? {
                    Some(s) if s.kind == crate::agentfs::Kind::File => s.size,
                    _ => 0,
                },
                Err(_) => 0,
            };
            if size < covered {
                lag.stale.push(id);
            } else {
                lag.behind_bytes += size - covered;
            }
        }
        Ok(Some(lag))
    }

    fn empty(convs_dir: Option<Dir>) -> Self {
        Index {
            convs_dir,
            files: None,
            ro_dir: None,
            snap: Snapshot::default(),
            term_ids: HashMap::new(),
            postings: Vec::new(),
            pending: HashMap::new(),
            docs: Docs::default(),
            convs: Vec::new(),
            conv_ids: HashMap::new(),
            persist: false,
            logs: Default::default(),
            corrupt: Default::default(),
            mem_cost: 0,
            flushed: false,
        }
    }

    /// Drop everything and index every conversation again.
    pub fn rebuild(&mut self) -> Result<(), RecallError> {
        self.clear()?;
        self.catch_up()?;
        self.maybe_compact();
        Ok(())
    }

    fn clear_memory(&mut self) {
        self.snap = Snapshot::default();
        self.term_ids.clear();
        self.postings.clear();
        self.pending.clear();
        self.docs = Docs::default();
        self.convs.clear();
        self.conv_ids.clear();
        self.logs.borrow_mut().clear();
        self.corrupt.set(false);
        self.mem_cost = 0;
    }

    /// Number of messages indexed.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// The id of conversation number `n`.
    pub(crate) fn conversation_id(&self, n: u32) -> &str {
        self.convs.get(n as usize).map_or("", |c| c.id.as_str())
    }

    /// The number of conversation `id`, when indexed.
    pub(crate) fn conversation_number(&self, id: &str) -> Option<u32> {
        self.conv_ids.get(id).copied()
    }

    fn term_id(&self, term: &str) -> Option<u32> {
        self.term_ids
            .get(term)
            .copied()
            .or_else(|| self.snap.find(term))
    }

    /// The postings of `term`, when indexed.
    pub(crate) fn postings_of(&self, term: &str) -> Option<&Postings> {
        self.postings_at(self.term_id(term)?)
    }

    /// Whether a piece of the snapshot failed its check since it was
    /// loaded (answers drawn from it are not to be trusted).
    pub(crate) fn corrupt(&self) -> bool {
        self.corrupt.get() || self.docs.corrupt()
    }

    fn postings_at(&self, id: u32) -> Option<&Postings> {
        let cell = self.postings.get(id as usize)?;
        Some(cell.get_or_init(|| {
            let mut p = self.snap.postings(id, self.docs.len()).unwrap_or_else(|| {
                self.corrupt.set(true);
                Postings::default()
            });
            if let Some(tail) = self.pending.get(&id) {
                // Appended after the snapshot: their doc ids are larger.
                for (j, &d) in tail.docs.iter().enumerate() {
                    p.push(d, tail.positions(j));
                }
            }
            Box::new(p)
        }))
    }

    fn conv_number(&mut self, id: &str) -> u32 {
        if let Some(&n) = self.conv_ids.get(id) {
            return n;
        }
        let n = self.convs.len() as u32;
        self.convs.push(ConvState {
            id: id.to_string(),
            covered: 0,
        });
        self.conv_ids.insert(id.to_string(), n);
        n
    }

    /// Re-read the stored message of doc `n` from its log.
    pub(crate) fn message(&self, n: u32) -> Option<StoredMessage> {
        let d = self.docs.get(n as usize)?;
        let mut logs = self.logs.borrow_mut();
        let f = match logs.entry(d.conv) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let dir = self
                    .convs_dir
                    .as_ref()?
                    .open_dir(self.conversation_id(d.conv))
                    .ok()?;
                e.insert(dir.open_file(MESSAGES_FILE_NAME).ok()?.0)
            }
        };
        let mut buf = vec![0u8; d.len as usize];
        f.read_exact_at(&mut buf, d.offset).ok()?;
        serde_json::from_slice(&buf).ok()
    }

    /// The bytes of file `name` of conversation `n` (at most `max`).
    pub(crate) fn read_conversation_file(&self, n: u32, name: &str, max: u64) -> Option<Vec<u8>> {
        let dir = self
            .convs_dir
            .as_ref()?
            .open_dir(self.conversation_id(n))
            .ok()?;
        dir.read_file_capped(name, max).ok().map(|(b, _)| b)
    }

    /// The bytes the index takes on disk.
    pub fn disk_size(&self) -> u64 {
        let len = |f: &File| f.metadata().map(|m| m.len()).unwrap_or(0);
        let dir = self.files.as_ref().map(|f| &f.dir).or(self.ro_dir.as_ref());
        let named = |name: &str| {
            dir.and_then(|d| d.stat_at(name).ok().flatten())
                .map_or(0, |s| s.size)
        };
        match &self.files {
            Some(f) => len(&f.terms) + len(&f.docs) + named(SNAPSHOT_FILE_NAME),
            None => [
                RECALL_TERMS_FILE_NAME,
                RECALL_DOCS_FILE_NAME,
                SNAPSHOT_FILE_NAME,
            ]
            .iter()
            .map(|n| named(n))
            .sum(),
        }
    }
}

/// The lock file, locked; a holder that never lets go costs a bounded wait.
fn lock(file: File) -> std::io::Result<nix::fcntl::Flock<File>> {
    crate::fsutil::flock_bounded(file, LOCK_WAIT, "the recall index")
}

#[cfg(test)]
mod corrupt_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::{Part, Role};
    use crate::recall::tokenize::{normalize, tokens_normalized};
    use crate::recall::{Filters, Query};
    use crate::store::conversation::Conversation;

    pub(super) fn agent_with(texts: &[&str]) -> (tempfile::TempDir, AgentPaths) {
        let dir = tempfile::tempdir().unwrap();
        let agent = crate::paths::Home::at(dir.path()).agent("a").unwrap();
        add(&agent, "one", texts);
        (dir, agent)
    }

    fn add(agent: &AgentPaths, conv: &str, texts: &[&str]) {
        let mut c = Conversation::open(agent, conv).unwrap();
        for t in texts {
            let id = c.next_id();
            let m = StoredMessage::new(
                id,
                Role::User,
                vec![Part::Text {
                    text: t.to_string(),
                }],
            );
            c.append(m).unwrap();
        }
    }

    pub(super) fn found(index: &Index, q: &str) -> Vec<(String, f64)> {
        index
            .search(&Query::parse(q), &Filters::default(), 20)
            .unwrap()
            .into_iter()
            .map(|h| (h.message_id, h.score))
            .collect()
    }

    pub(super) const TEXTS: &[&str] = &[
        "the green tea is cold",
        "tea that is green",
        "evergreen tea leaves, green. tea",
        "我最喜欢喝绿茶，尤其是早上",
        "绿色的茶 green tea green tea",
        "deploy the server tomorrow",
    ];
    pub(super) const QUERIES: &[&str] = &[
        "\"green tea\"",
        "tea",
        "\"绿茶\"",
        "green \"tea is\"",
        "\"green. tea\"",
        "deploy server",
        "\"the server\" 茶",
    ];

    #[test]
    fn positions_never_rule_out_a_phrase_that_occurs() {
        let (_d, agent) = agent_with(TEXTS);
        let index = Index::open(&agent).unwrap();
        for q in QUERIES {
            for p in &Query::parse(q).phrases {
                let mut seq = Vec::new();
                tokens_normalized(&p.text, |t| seq.push(index.postings_of(t)));
                let seq: Option<Vec<&Postings>> = seq.into_iter().collect();
                for d in 0..index.len() as u32 {
                    let text = normalize(&searchable_text(&index.message(d).unwrap()));
                    let occurs = super::super::query::phrase_count(&text, &p.text) > 0;
                    let may = seq.as_ref().is_some_and(|s| may_be_consecutive(d, s));
                    assert!(!occurs || may, "{q} in doc {d}");
                }
            }
        }
        // The positions do rule out a message with the words apart.
        let seq = [
            index.postings_of("green").unwrap(),
            index.postings_of("tea").unwrap(),
        ];
        assert!(!may_be_consecutive(1, &seq));
        assert!(may_be_consecutive(0, &seq));
    }

    #[test]
    fn a_snapshot_gives_the_same_answers_and_a_torn_one_is_rebuilt() {
        let (_d, agent) = agent_with(TEXTS);
        let mut index = Index::open(&agent).unwrap();
        let before: Vec<_> = QUERIES.iter().map(|q| found(&index, q)).collect();
        index.compact().unwrap();
        assert_eq!(
            QUERIES.iter().map(|q| found(&index, q)).collect::<Vec<_>>(),
            before
        );
        drop(index);
        let recall = agent.recall_dir();
        assert!(recall.join(SNAPSHOT_FILE_NAME).exists());
        let index = Index::open(&agent).unwrap();
        assert!(index.snap.n_terms > 0);
        assert_eq!(
            QUERIES.iter().map(|q| found(&index, q)).collect::<Vec<_>>(),
            before
        );
        drop(index);
        // Appends after the snapshot go to the logs and are replayed.
        add(&agent, "two", &["green tea again", "新的绿茶"]);
        let index = Index::open(&agent).unwrap();
        let after: Vec<_> = QUERIES.iter().map(|q| found(&index, q)).collect();
        assert_eq!(index.len(), TEXTS.len() + 2);
        assert_eq!(found(&index, "\"green tea\"").len(), 3);
        drop(index);
        let ro = Index::open_read_only(&agent).unwrap();
        assert_eq!(
            QUERIES.iter().map(|q| found(&ro, q)).collect::<Vec<_>>(),
            after
        );
        drop(ro);
        // A torn snapshot: the logs continue it, so everything is rebuilt.
        let snap = recall.join(SNAPSHOT_FILE_NAME);
        let len = std::fs::metadata(&snap).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&snap)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
        let ro = Index::open_read_only(&agent).unwrap();
        assert_eq!(
            QUERIES.iter().map(|q| found(&ro, q)).collect::<Vec<_>>(),
            after
        );
        drop(ro);
        let index = Index::open(&agent).unwrap();
        assert_eq!(
            QUERIES.iter().map(|q| found(&index, q)).collect::<Vec<_>>(),
            after
        );
        assert!(!snap.exists());
    }

    /// Names, sizes and modification times of everything under `dir`.
    fn listing(dir: &std::path::Path) -> Vec<(String, u64, std::time::SystemTime)> {
        let mut out = Vec::new();
        for e in walk(dir) {
            let m = std::fs::symlink_metadata(&e).unwrap();
            out.push((e.display().to_string(), m.len(), m.modified().unwrap()));
        }
        out.sort();
        out
    }

    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = vec![dir.to_path_buf()];
        if dir.is_dir() {
            for e in std::fs::read_dir(dir).unwrap() {
                out.extend(walk(&e.unwrap().path()));
            }
        }
        out
    }

    fn chmod_tree(dir: &std::path::Path, dirs: u32, files: u32) {
        use std::os::unix::fs::PermissionsExt;
        for p in walk(dir) {
            let mode = if p.is_dir() { dirs } else { files };
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }

    #[test]
    fn read_only_open_writes_nothing() {
        let (_d, agent) = agent_with(TEXTS);
        let mut index = Index::open(&agent).unwrap();
        index.compact().unwrap();
        drop(index);
        // Newer lines than the index, and a new conversation.
        add(&agent, "one", &["green tea later"]);
        add(&agent, "two", &["green tea elsewhere"]);
        let convs = agent.conversations_dir();
        chmod_tree(&convs, 0o555, 0o444);
        let before = listing(&convs);
        let hits = super::super::search_read_only(&agent, "\"green tea\"", &Filters::default(), 10)
            .unwrap();
        assert_eq!(hits.len(), 4);
        let ro = Index::open_read_only(&agent).unwrap();
        assert_eq!(ro.len(), TEXTS.len() + 2);
        drop(ro);
        assert_eq!(listing(&convs), before);
        chmod_tree(&convs, 0o755, 0o644);

        // No index at all: indexed in memory, nothing created.
        std::fs::remove_dir_all(agent.recall_dir()).unwrap();
        chmod_tree(&convs, 0o555, 0o444);
        let before = listing(&convs);
        let hits = super::super::search_read_only(&agent, "\"green tea\"", &Filters::default(), 10)
            .unwrap();
        assert_eq!(hits.len(), 4);
        assert_eq!(listing(&convs), before);
        assert!(!agent.recall_dir().exists());
        chmod_tree(&convs, 0o755, 0o644);

        // No conversations directory: no results, nothing created.
        let dir = tempfile::tempdir().unwrap();
        let empty = crate::paths::Home::at(dir.path()).agent("b").unwrap();
        let ro = Index::open_read_only(&empty).unwrap();
        assert!(ro.is_empty());
        assert!(!empty.conversations_dir().exists());
    }
}
