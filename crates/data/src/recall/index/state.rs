//! An open index's state in memory: the [`Index`] itself, what it keeps of
//! each message and conversation, and where the loaded snapshot's tables
//! are. Its methods live in the files beside this one.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::fs::File;

use super::docs::Docs;
use super::postings::Postings;
use crate::agentfs::Dir;

/// Most conversations an agent's index follows.
pub(super) const MAX_CONVERSATIONS: usize = 100_000;
/// Permission bits of the index's files.
pub(super) const PERM: u32 = 0o644;

#[derive(Debug)]
pub(super) struct ConvState {
    pub(super) id: String,
    pub(super) covered: u64,
}

/// The files of an index open for writing.
pub(super) struct Files {
    pub(super) dir: Dir,
    pub(super) _lock: nix::fcntl::Flock<File>,
    pub(super) terms: File,
    pub(super) docs: File,
}

/// An open, caught-up index (locked, unless read-only).
pub struct Index {
    pub(super) convs_dir: Option<Dir>,
    /// `None` when read-only.
    pub(super) files: Option<Files>,
    /// The recall directory of a read-only index, when there is one.
    pub(super) ro_dir: Option<Dir>,
    pub(super) snap: Snapshot,
    /// Terms past the snapshot's, and snapshot terms already looked up
    /// while indexing (a hash probe is cheaper than a binary search).
    pub(super) term_ids: HashMap<String, u32>,
    /// Per term id; a snapshot term's are decoded when first used.
    pub(super) postings: Vec<OnceCell<Box<Postings>>>,
    /// Entries appended to snapshot terms not decoded yet, merged in when
    /// they are (an append then costs no decoding of common terms).
    pub(super) pending: HashMap<u32, Postings>,
    /// Every message: the snapshot's read in place, later ones in memory.
    pub(crate) docs: Docs,
    pub(super) convs: Vec<ConvState>,
    pub(super) conv_ids: HashMap<String, u32>,
    /// Whether appends reach the disk (a failed write stops them; the
    /// next open indexes what is missing again).
    pub(super) persist: bool,
    /// Open message logs, by conversation number (results re-read lines).
    pub(super) logs: std::cell::RefCell<HashMap<u32, File>>,
    /// Set when a piece of the snapshot failed its check: what was read
    /// from it cannot be trusted, and the index is rebuilt.
    pub(super) corrupt: std::cell::Cell<bool>,
    /// About the bytes of memory the postings and messages indexed since
    /// the snapshot take: past a bound, a writable index compacts, so
    /// indexing a million messages never holds them all in memory.
    pub(super) mem_cost: usize,
    /// Whether indexing compacted since this index was opened.
    pub(super) flushed: bool,
}

/// A loaded snapshot: its bytes (read in on demand) and where its tables are.
#[derive(Default)]
pub(super) struct Snapshot {
    pub(super) map: Option<std::sync::Arc<super::map::Map>>,
    pub(super) n_terms: u32,
    /// `n_terms + 1` u32 offsets into `term_blob`.
    pub(super) term_offs: usize,
    pub(super) term_blob: usize,
    /// `n_terms + 1` u64 file offsets of each term's postings.
    pub(super) post_table: usize,
}
