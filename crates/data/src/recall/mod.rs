//! Recall: ranked search over everything an agent has said (spec
//! agent-loop.md §6, book ch. 13). `tokenize` makes tokens, `query` parses
//! terms and phrases, `bm25` scores, `index` keeps the persistent inverted
//! index beside the conversations and catches it up, `search` applies
//! filters and builds result rows; `error` is what recall fails with.

pub mod bm25;
mod error;
pub mod index;
pub mod query;
pub mod search;
pub mod tokenize;

pub use error::RecallError;
pub use index::Index;
pub use query::Query;
pub use search::{Filters, Hit, search, search_read_only};
