//! The persistent inverted index of one agent's conversations, in
//! `conversations/.recall/` (the agent child may write it: its profile
//! grants `$AGENT/conversations`).
//!
//! Two append-only logs of records, each `[u32 length][u32 CRC-32][payload]`
//! (little-endian):
//!
//! * `terms-v1.log` — batches of new terms; a term's id is its position
//!   (after the snapshot's terms, when there is one).
//! * `docs-v1.log` — batches of indexed messages of one conversation (a
//!   payload starts with a 0 byte, the format mark): the conversation id,
//!   the byte length of its `messages.jsonl` the batch covers (the
//!   high-water mark), then per message its line's offset and length,
//!   role, time and `(term id, tf, positions)` (ids and positions
//!   delta-coded).
//!
//! and `snapshot-v1.bin`, the compacted state: when the logs grow past a
//! threshold, everything is written as one file (replaced atomically), and
//! each log is replaced by a single *base* record naming the snapshot's
//! generation. Opening reads the snapshot in one read, checks its CRC and
//! decodes only the message table; a term's postings are decoded the first
//! time a query (or an append) touches them, so a one-shot search pays for
//! its own terms only. The logs are replayed on top. The logs decide which
//! snapshot counts: both starting with the base record of the snapshot's
//! generation means "snapshot + these records"; no base record means the
//! logs hold everything (a crash between writing a snapshot and replacing
//! the logs — the snapshot is ignored); anything else (a torn snapshot,
//! mixed generations) means state is missing and the index is rebuilt.
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

use std::cell::OnceCell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use super::RecallError;
use super::tokenize::{normalize, tokens_normalized};
use crate::agentfs::Dir;
use crate::paths::{
    AgentPaths, CONVERSATIONS_DIR_NAME, MESSAGES_FILE_NAME, RECALL_DIR_NAME, RECALL_DOCS_FILE_NAME,
    RECALL_LOCK_FILE_NAME, RECALL_TERMS_FILE_NAME, is_valid_agent_id,
};
use crate::protocol::messages::{Part, Role};
use crate::store::conversation::StoredMessage;

/// Largest index log read (the child can grow it).
pub const MAX_INDEX_BYTES: u64 = 1 << 30;
/// Largest conversation log indexed.
pub const MAX_LOG_BYTES: u64 = crate::store::conversation::MAX_LOG_BYTES;
/// Most conversations an agent's index follows.
const MAX_CONVERSATIONS: usize = 100_000;
/// Bytes of a conversation log read at once while catching up; a line
/// that does not fit in one (with its newline) is skipped: the lines the
/// conversation readers skip too.
const CHUNK: u64 = crate::store::conversation::lines::MAX_LINE_BYTES as u64 + 1;
/// How long opening waits for another holder of the index.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
const PERM: u32 = 0o644;
/// The compacted index.
pub const SNAPSHOT_FILE_NAME: &str = "snapshot-v1.bin";
const SNAPSHOT_MAGIC: &[u8; 8] = b"MLRECAL1";
/// The logs are compacted into a snapshot once they hold this many bytes
/// and a quarter of the snapshot's size (so compaction stays amortised).
const COMPACT_MIN_BYTES: u64 = 1 << 20;
/// A log's first record after compaction: this tag and the generation.
const BASE_TAG: &[u8; 4] = b"BASE";
/// The first byte of a docs batch (older batches started otherwise).
const BATCH_MARK: u8 = 0;
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
    fn push(&mut self, doc: u32, positions: &[u32]) {
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

/// How an index on disk stands against the logs ([`Index::lag`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lag {
    /// Log bytes not indexed yet (the next search catches up).
    pub behind_bytes: u64,
    /// Conversations whose log is shorter than the index says it covered
    /// (truncated or replaced): their entries no longer match the log.
    pub stale: Vec<String>,
}

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

#[derive(Debug)]
struct ConvState {
    id: String,
    covered: u64,
}

/// The files of an index open for writing.
struct Files {
    dir: Dir,
    _lock: nix::fcntl::Flock<File>,
    terms: File,
    docs: File,
}

/// A loaded snapshot: its bytes and where its tables are.
#[derive(Default)]
struct Snapshot {
    generation: u64,
    bytes: Vec<u8>,
    n_terms: u32,
    /// `n_terms + 1` u32 offsets into `term_blob`.
    term_offs: usize,
    term_blob: usize,
    /// `n_terms + 1` u64 offsets into `post_blob`.
    post_offs: usize,
    post_blob: usize,
}

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
    fn find(&self, term: &str) -> Option<u32> {
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
    fn postings(&self, i: u32, n_docs: usize) -> Postings {
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

/// An open, caught-up index (locked, unless read-only).
pub struct Index {
    convs_dir: Option<Dir>,
    /// `None` when read-only.
    files: Option<Files>,
    /// The recall directory of a read-only index, when there is one.
    ro_dir: Option<Dir>,
    snap: Snapshot,
    /// Terms past the snapshot's, and snapshot terms already looked up
    /// while indexing (a hash probe is cheaper than a binary search).
    term_ids: HashMap<String, u32>,
    /// Per term id; a snapshot term's are decoded when first used.
    postings: Vec<OnceCell<Box<Postings>>>,
    /// Entries appended to snapshot terms not decoded yet, merged in when
    /// they are (an append then costs no decoding of common terms).
    pending: HashMap<u32, Postings>,
    pub(crate) docs: Vec<DocMeta>,
    /// Each doc's `dl` again, packed: ranking a common term reads one per
    /// posting, and a quarter of the bytes keeps that pass in cache.
    pub(crate) dls: Vec<u32>,
    convs: Vec<ConvState>,
    conv_ids: HashMap<String, u32>,
    /// Whether appends reach the disk (a failed write stops them; the
    /// next open indexes what is missing again).
    persist: bool,
    /// Open message logs, by conversation number (results re-read lines).
    logs: std::cell::RefCell<HashMap<u32, File>>,
}

fn fs(e: crate::agentfs::FsError) -> RecallError {
    RecallError::Fs(e)
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> RecallError + '_ {
    move |source| RecallError::Io {
        what: what.to_string(),
        source,
    }
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
        Ok(index)
    }

    /// Open and load without catching up.
    pub fn open_only(agent: &AgentPaths) -> Result<Self, RecallError> {
        let convs_dir = conversations_dir(agent)?;
        let dir = convs_dir.create_dir(RECALL_DIR_NAME, 0o755).map_err(fs)?;
        let lock = lock(dir.open_append(RECALL_LOCK_FILE_NAME, PERM).map_err(fs)?)
            .map_err(io("recall index lock"))?;
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
            docs: Vec::new(),
            dls: Vec::new(),
            convs: Vec::new(),
            conv_ids: HashMap::new(),
            persist: false,
            logs: Default::default(),
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
        self.docs.clear();
        self.dls.clear();
        self.convs.clear();
        self.conv_ids.clear();
        self.logs.borrow_mut().clear();
    }

    fn clear(&mut self) -> Result<(), RecallError> {
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

    fn postings_at(&self, id: u32) -> Option<&Postings> {
        let cell = self.postings.get(id as usize)?;
        Some(cell.get_or_init(|| {
            let mut p = self.snap.postings(id, self.docs.len());
            if let Some(tail) = self.pending.get(&id) {
                // Appended after the snapshot: their doc ids are larger.
                for (j, &d) in tail.docs.iter().enumerate() {
                    p.push(d, tail.positions(j));
                }
            }
            Box::new(p)
        }))
    }

    /// The bytes of recall file `name` (empty when missing).
    fn read_index_file(&self, name: &str) -> Result<Vec<u8>, RecallError> {
        if let Some(f) = &self.files {
            let file = if name == RECALL_TERMS_FILE_NAME {
                &f.terms
            } else if name == RECALL_DOCS_FILE_NAME {
                &f.docs
            } else {
                return match f.dir.open_file(name) {
                    Ok((file, _)) => read_all(&file).map_err(io("recall snapshot")),
                    Err(e) if e.is_not_found() => Ok(Vec::new()),
                    Err(e) => Err(fs(e)),
                };
            };
            return read_all(file).map_err(io("recall index log"));
        }
        let Some(dir) = &self.ro_dir else {
            return Ok(Vec::new());
        };
        match dir.open_file(name) {
            Ok((file, _)) => read_all(&file).map_err(io("recall index file")),
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(fs(e)),
        }
    }

    fn load(&mut self) -> Result<(), RecallError> {
        let terms = self.read_index_file(RECALL_TERMS_FILE_NAME)?;
        let docs = self.read_index_file(RECALL_DOCS_FILE_NAME)?;
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
                let bytes = self.read_index_file(SNAPSHOT_FILE_NAME)?;
                if !self.load_snapshot(bytes, a) {
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

    /// Take `bytes` as the snapshot of generation `generation`; false (nothing
    /// changed) when it is not a whole snapshot of that generation.
    fn load_snapshot(&mut self, bytes: Vec<u8>, generation: u64) -> bool {
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

    fn apply(&mut self, batch: Batch) {
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
                    None => self.pending.entry(t).or_default().push(id, positions),
                }
                dl = dl.saturating_add(u32::from(tf));
            }
            self.dls.push(dl);
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

    /// Index every conversation's messages past its high-water mark; rebuild
    /// when the index is stale (a log shorter than its mark, a
    /// conversation gone).
    pub fn catch_up(&mut self) -> Result<(), RecallError> {
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

    /// Tokenise complete lines starting at byte `base` of conversation
    /// `conv`'s log into a batch (new terms get ids here).
    fn index_lines(&mut self, conv: &str, base: u64, chunk: &[u8]) -> (Vec<String>, Batch) {
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
                            id
                        }
                        None => {
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

    fn write_and_apply(&mut self, (new_terms, batch): (Vec<String>, Batch)) {
        if self.persist
            && let Err(e) = self.write(&new_terms, &batch)
        {
            tracing::warn!("recall index: not saved ({e}); it is rebuilt on the next open");
            self.persist = false;
        }
        self.apply(batch);
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
    fn maybe_compact(&mut self) {
        let Some(f) = &self.files else {
            return;
        };
        if !self.persist {
            return;
        }
        let len = |f: &File| f.metadata().map(|m| m.len()).unwrap_or(0);
        let logs = len(&f.terms) + len(&f.docs);
        if logs < COMPACT_MIN_BYTES || logs < self.snap.bytes.len() as u64 / 4 {
            return;
        }
        if let Err(e) = self.compact() {
            tracing::warn!("recall index: not compacted ({e})");
        }
    }

    /// Write everything as a snapshot, then start both logs afresh on it.
    pub fn compact(&mut self) -> Result<(), RecallError> {
        // A fresh generation, so logs never pair with another snapshot.
        let generation = rand::random::<u64>();
        let bytes = self.encode_snapshot(generation);
        let Some(f) = &mut self.files else {
            return Ok(());
        };
        f.dir
            .replace_file(SNAPSHOT_FILE_NAME, &bytes, PERM)
            .map_err(fs)?;
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
        if !self.load_snapshot(bytes, generation) {
            return Err(RecallError::Invalid(
                "a recall snapshot just written does not read back".into(),
            ));
        }
        Ok(())
    }

    /// The whole state as a snapshot of generation `generation`: header, terms
    /// (sorted, so a term is found by binary search), postings (an offset
    /// per term, so each decodes alone), conversations, messages; a CRC of
    /// all of it at the end.
    fn encode_snapshot(&self, generation: u64) -> Vec<u8> {
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

/// The generation a log's base record names, if `payload` is one.
fn base_gen(payload: &[u8]) -> Option<u64> {
    let rest = payload.strip_prefix(BASE_TAG.as_slice())?;
    let b: [u8; 8] = rest.try_into().ok()?;
    Some(u64::from_le_bytes(b))
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

fn encode_postings(out: &mut Vec<u8>, p: &Postings) {
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

fn decode_postings(b: &[u8], n_docs: usize) -> Option<Postings> {
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

/// The text of a message that recall searches: its text, tool calls' names
/// and arguments, tool results' names and text.
pub fn searchable_text(msg: &StoredMessage) -> String {
    let mut out = String::new();
    for part in &msg.parts {
        if !out.is_empty() {
            out.push('\n');
        }
        match part {
            Part::Text { text } => out.push_str(text),
            Part::ToolCall {
                name, arguments, ..
            } => {
                out.push_str(name);
                out.push(' ');
                match arguments {
                    serde_json::Value::String(s) => out.push_str(s),
                    v => out.push_str(&v.to_string()),
                }
            }
            Part::ToolResult { name, text, .. } => {
                out.push_str(name);
                out.push(' ');
                out.push_str(text);
            }
        }
    }
    out
}

/// Unix seconds of an RFC 3339 time; 0 when unparsable.
pub fn parse_ts(ts: &str) -> i64 {
    time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339)
        .map(|t| t.unix_timestamp())
        .unwrap_or(0)
}

struct Doc {
    offset: u64,
    len: u32,
    ts: i64,
    role: Role,
    terms: Vec<(u32, u16)>,
    /// Each term's positions in turn (`tf` of them).
    pos: Vec<u32>,
}

struct Batch {
    conv: String,
    covered: u64,
    docs: Vec<Doc>,
}

fn role_code(r: Role) -> u8 {
    match r {
        Role::User => 0,
        Role::Assistant => 1,
        Role::Tool => 2,
    }
}

fn role_of(b: u8) -> Option<Role> {
    match b {
        0 => Some(Role::User),
        1 => Some(Role::Assistant),
        2 => Some(Role::Tool),
        _ => None,
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

fn encode_batch(b: &Batch) -> Vec<u8> {
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

fn decode_batch(p: &[u8], n_terms: u64) -> Option<Batch> {
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

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint(p: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = *p.get(*at)?;
        *at += 1;
        if shift > 63 {
            return None;
        }
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
        shift += 7;
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn bytes<'a>(p: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let n = usize::try_from(varint(p, at)?).ok()?;
    let end = at.checked_add(n)?;
    let b = p.get(*at..end)?;
    *at = end;
    Some(b)
}

/// The valid records of a log and the length they take: reading stops at
/// the first torn or corrupt one.
fn records(data: &[u8]) -> (u64, Vec<&[u8]>) {
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
fn append_record(file: &mut File, payload: &[u8]) -> std::io::Result<()> {
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

fn read_all(file: &File) -> std::io::Result<Vec<u8>> {
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

fn read_at_full(file: &File, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
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

/// The lock file, locked; a holder that never lets go costs a bounded wait.
fn lock(file: File) -> std::io::Result<nix::fcntl::Flock<File>> {
    crate::fsutil::flock_bounded(file, LOCK_WAIT, "the recall index")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_refuse_garbage() {
        let mut v = Vec::new();
        for n in [0u64, 1, 127, 128, 300, u64::MAX] {
            put_varint(&mut v, n);
        }
        let mut at = 0;
        for n in [0u64, 1, 127, 128, 300, u64::MAX] {
            assert_eq!(varint(&v, &mut at), Some(n));
        }
        assert_eq!(varint(&[0xff; 20], &mut 0), None);
        assert!(decode_batch(&[0xff; 40], 10).is_none());
    }

    use crate::recall::{Filters, Query};
    use crate::store::conversation::Conversation;

    fn agent_with(texts: &[&str]) -> (tempfile::TempDir, AgentPaths) {
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

    fn found(index: &Index, q: &str) -> Vec<(String, f64)> {
        index
            .search(&Query::parse(q), &Filters::default(), 20)
            .unwrap()
            .into_iter()
            .map(|h| (h.message_id, h.score))
            .collect()
    }

    const TEXTS: &[&str] = &[
        "the green tea is cold",
        "tea that is green",
        "evergreen tea leaves, green. tea",
        "我最喜欢喝绿茶，尤其是早上",
        "绿色的茶 green tea green tea",
        "deploy the server tomorrow",
    ];
    const QUERIES: &[&str] = &[
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
