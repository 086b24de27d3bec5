//! MemFS: an agent's long-term memory as a git repository of Markdown files.
//!
//! Everything that reads or writes the memory repository lives here: repository
//! access through git2, frontmatter parsing, path roles, the system-prompt
//! compiler and (in `validate`) the commit validator.

pub mod collate;
pub mod commit;
pub mod compiler;
pub mod fence;
pub mod frontmatter;
pub mod gitcli;
pub mod hook;
pub mod layout;
pub mod links;
pub mod lock;
pub mod mirror;
pub mod ops;
pub mod pathrules;
pub mod push_claim;
pub mod remote_repo;
pub mod remote_root;
pub mod repo;
pub mod revision;
pub mod snapshot;
pub mod status;
pub mod sync;
pub mod template;
pub mod text;
pub mod transport;
pub mod validate;
pub mod worktree;
