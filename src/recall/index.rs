//! The persistent inverted index of one agent's conversations, in
//! `conversations/.recall/` (the agent child may write it: its profile
//! grants `$AGENT/conversations`).
//!
//! Two append-only logs of records, each `[u32 length][u32 CRC-32][payload]`
//! (little-endian):
//!
//! * `terms-v1.log` — batches of new terms; a term's id is its position.
//! * `docs-v1.log` — batches of indexed messages of one conversation: the
//!   conversation id, the byte length of its `messages.jsonl` the batch
//!   covers (the high-water mark), then per message its line's offset and
//!   length, role, time and `(term id, tf)` pairs (ids delta-coded).
//!
//! Opening reads both logs into memory (postings per term id: doc ids
//! ascending with term frequencies; a metadata row per doc) without
//! hashing per occurrence. A record that is torn, fails its checksum or
//! names an unknown term or a conversation id that is not valid ends the
//! log: it is cut off there and what it covered is indexed again. Then the
//! index *catches up*: each conversation's log past its high-water mark
//! is indexed (complete lines only), so a query never sees a stale index;
//! a log shorter than its mark, or a conversation gone, means the index
//! is stale and is rebuilt. Writers and readers hold `lock` (flock), so
//! two processes never append at once. The message text is not kept:
//! results re-read their line from `messages.jsonl`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use super::RecallError;
use super::tokenize::{normalize, tokens_normalized};
use crate::agent::conversation::StoredMessage;
use crate::agentfs::Dir;
use crate::paths::{
    AgentPaths, CONVERSATIONS_DIR_NAME, MESSAGES_FILE_NAME, RECALL_DIR_NAME, RECALL_DOCS_FILE_NAME,
    RECALL_LOCK_FILE_NAME, RECALL_TERMS_FILE_NAME, is_valid_agent_id,
};
use crate::protocol::messages::{Part, Role};

/// Largest index log read (the child can grow it).
pub const MAX_INDEX_BYTES: u64 = 1 << 30;
/// Largest conversation log indexed.
pub const MAX_LOG_BYTES: u64 = crate::agent::conversation::MAX_LOG_BYTES;
/// Most conversations an agent's index follows.
const MAX_CONVERSATIONS: usize = 100_000;
/// Bytes of a conversation log read at once while catching up; a line
/// that does not fit in one is skipped.
const CHUNK: u64 = 16 << 20;
/// How long opening waits for another holder of the index.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
const PERM: u32 = 0o644;

/// Postings of one term: doc ids ascending, with term frequencies.
#[derive(Debug, Default, Clone)]
pub struct Postings {
    pub docs: Vec<u32>,
    pub tfs: Vec<u16>,
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

/// An open, locked, caught-up index.
pub struct Index {
    convs_dir: Dir,
    _lock: nix::fcntl::Flock<File>,
    terms_file: File,
    docs_file: File,
    term_ids: HashMap<String, u32>,
    pub(crate) postings: Vec<Postings>,
    pub(crate) docs: Vec<DocMeta>,
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
        Ok(index)
    }

    /// Open and load without catching up.
    pub fn open_only(agent: &AgentPaths) -> Result<Self, RecallError> {
        let convs_dir = conversations_dir(agent)?;
        let dir = convs_dir.create_dir(RECALL_DIR_NAME, 0o755).map_err(fs)?;
        let lock = lock(dir.open_append(RECALL_LOCK_FILE_NAME, PERM).map_err(fs)?)
            .map_err(io("recall index lock"))?;
        let terms_file = dir.open_append(RECALL_TERMS_FILE_NAME, PERM).map_err(fs)?;
        let docs_file = dir.open_append(RECALL_DOCS_FILE_NAME, PERM).map_err(fs)?;
        let mut index = Index {
            convs_dir,
            _lock: lock,
            terms_file,
            docs_file,
            term_ids: HashMap::new(),
            postings: Vec::new(),
            docs: Vec::new(),
            convs: Vec::new(),
            conv_ids: HashMap::new(),
            persist: true,
            logs: Default::default(),
        };
        index.load()?;
        Ok(index)
    }

    /// Drop everything and index every conversation again.
    pub fn rebuild(&mut self) -> Result<(), RecallError> {
        self.clear()?;
        self.catch_up()
    }

    fn clear(&mut self) -> Result<(), RecallError> {
        self.term_ids.clear();
        self.postings.clear();
        self.docs.clear();
        self.convs.clear();
        self.conv_ids.clear();
        self.logs.borrow_mut().clear();
        self.persist = true;
        self.terms_file.set_len(0).map_err(io("recall terms log"))?;
        self.docs_file.set_len(0).map_err(io("recall docs log"))?;
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

    /// The postings of `term`, when indexed.
    pub(crate) fn postings_of(&self, term: &str) -> Option<&Postings> {
        self.term_ids
            .get(term)
            .and_then(|&id| self.postings.get(id as usize))
    }

    fn load(&mut self) -> Result<(), RecallError> {
        let terms = read_all(&self.terms_file).map_err(io("recall terms log"))?;
        let (good, recs) = records(&terms);
        for payload in recs {
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
                self.postings.push(Postings::default());
            }
        }
        if (good as usize) < terms.len() {
            tracing::warn!("recall index: torn terms log cut at {good} bytes");
            let _ = self.terms_file.set_len(good);
        }
        drop(terms);
        let docs = read_all(&self.docs_file).map_err(io("recall docs log"))?;
        let (mut good, recs) = records(&docs);
        let mut at = 0u64;
        for payload in recs {
            if !self.load_batch(payload) {
                good = at;
                break;
            }
            at += 8 + payload.len() as u64;
        }
        if (good as usize) < docs.len() {
            // A batch is decoded whole before it is applied, so nothing of
            // the bad one is in memory; what it covered is indexed again.
            tracing::warn!("recall index: docs log cut at {good} bytes");
            self.docs_file
                .set_len(good)
                .map_err(io("recall docs log"))?;
        }
        Ok(())
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
            for (t, tf) in d.terms {
                if let Some(p) = self.postings.get_mut(t as usize) {
                    p.docs.push(id);
                    p.tfs.push(tf);
                    dl = dl.saturating_add(u32::from(tf));
                }
            }
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
        let mut ids: Vec<String> = self
            .convs_dir
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
        let dir = match self.convs_dir.open_dir(id) {
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
                tracing::warn!("recall index: {id}: a line over {CHUNK} bytes skipped");
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
        let mut ids: Vec<u32> = Vec::new();
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
            ids.clear();
            tokens_normalized(&text, |t| {
                let id = match self.term_ids.get(t) {
                    Some(&id) => id,
                    None => {
                        let id = self.postings.len() as u32;
                        self.term_ids.insert(t.to_string(), id);
                        self.postings.push(Postings::default());
                        new_terms.push(t.to_string());
                        id
                    }
                };
                ids.push(id);
            });
            ids.sort_unstable();
            let mut terms: Vec<(u32, u16)> = Vec::new();
            for &id in &ids {
                match terms.last_mut() {
                    Some((t, tf)) if *t == id => *tf = tf.saturating_add(1),
                    _ => terms.push((id, 1)),
                }
            }
            docs.push(Doc {
                offset,
                len: u32::try_from(line.len()).unwrap_or(u32::MAX),
                ts: parse_ts(&msg.ts),
                role: msg.role,
                terms,
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
        if !new_terms.is_empty() {
            let mut p = Vec::new();
            put_varint(&mut p, new_terms.len() as u64);
            for t in new_terms {
                put_bytes(&mut p, t.as_bytes());
            }
            append_record(&mut self.terms_file, &p)?;
        }
        append_record(&mut self.docs_file, &encode_batch(batch))
    }

    /// Re-read the stored message of doc `n` from its log.
    pub(crate) fn message(&self, n: u32) -> Option<StoredMessage> {
        let d = self.docs.get(n as usize)?;
        let mut logs = self.logs.borrow_mut();
        let f = match logs.entry(d.conv) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let dir = self.convs_dir.open_dir(self.conversation_id(d.conv)).ok()?;
                e.insert(dir.open_file(MESSAGES_FILE_NAME).ok()?.0)
            }
        };
        let mut buf = vec![0u8; d.len as usize];
        f.read_exact_at(&mut buf, d.offset).ok()?;
        serde_json::from_slice(&buf).ok()
    }

    /// The bytes of file `name` of conversation `n` (at most `max`).
    pub(crate) fn read_conversation_file(&self, n: u32, name: &str, max: u64) -> Option<Vec<u8>> {
        let dir = self.convs_dir.open_dir(self.conversation_id(n)).ok()?;
        dir.read_file_capped(name, max).ok().map(|(b, _)| b)
    }

    /// The bytes the index takes on disk.
    pub fn disk_size(&self) -> u64 {
        let len = |f: &File| f.metadata().map(|m| m.len()).unwrap_or(0);
        len(&self.terms_file) + len(&self.docs_file)
    }
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

fn encode_batch(b: &Batch) -> Vec<u8> {
    let mut p = Vec::with_capacity(64 + b.docs.len() * 64);
    put_bytes(&mut p, b.conv.as_bytes());
    put_varint(&mut p, b.covered);
    put_varint(&mut p, b.docs.len() as u64);
    for d in &b.docs {
        put_varint(&mut p, d.offset);
        put_varint(&mut p, u64::from(d.len));
        p.push(role_code(d.role));
        put_varint(&mut p, ((d.ts << 1) ^ (d.ts >> 63)) as u64);
        put_varint(&mut p, d.terms.len() as u64);
        let mut prev = 0u32;
        for &(t, tf) in &d.terms {
            put_varint(&mut p, u64::from(t - prev));
            put_varint(&mut p, u64::from(tf));
            prev = t;
        }
    }
    p
}

fn decode_batch(p: &[u8], n_terms: u64) -> Option<Batch> {
    let mut at = 0;
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
        let role = match *p.get(at)? {
            0 => Role::User,
            1 => Role::Assistant,
            2 => Role::Tool,
            _ => return None,
        };
        at += 1;
        let z = varint(p, &mut at)?;
        let ts = ((z >> 1) as i64) ^ -((z & 1) as i64);
        let nt = varint(p, &mut at)?;
        let mut terms = Vec::with_capacity(nt.min(1 << 16) as usize);
        let mut t = 0u64;
        for _ in 0..nt {
            t = t.checked_add(varint(p, &mut at)?)?;
            if t >= n_terms {
                return None;
            }
            let tf = u16::try_from(varint(p, &mut at)?).ok()?;
            terms.push((t as u32, tf));
        }
        docs.push(Doc {
            offset,
            len,
            ts,
            role,
            terms,
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
