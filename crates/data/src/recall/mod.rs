//! Recall: ranked search over everything an agent has said (spec
//! agent-loop.md §6, book ch. 13). `tokenize` makes tokens, `query` parses
//! terms and phrases, `bm25` scores, `index` keeps the persistent inverted
//! index beside the conversations and catches it up, `search` applies
//! filters and builds result rows.

pub mod bm25;
pub mod index;
pub mod query;
pub mod search;
pub mod tokenize;

pub use index::Index;
pub use query::Query;
pub use search::{Filters, Hit, search, search_read_only};

#[derive(Debug, thiserror::Error)]
pub enum RecallError {
    #[error(transparent)]
    Fs(#[from] crate::agentfs::FsError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Conversation(#[from] crate::store::conversation::ConversationError),
    /// A log is shorter than the index says it covered.
    #[error("the recall index is stale")]
    Stale,
    #[error("{0}")]
    Invalid(String),
}
