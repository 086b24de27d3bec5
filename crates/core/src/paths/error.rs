//! [`PathsError`] and the names a path may be built from: the id alphabet
//! of agents, conversations and launches, and single plain components;
//! [`HOME_ENV`], which the error names when there is no home.

/// Environment variable naming the home directory.
pub const HOME_ENV: &str = "MINI_LETTA_HOME";

#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error("cannot find a home directory: set {HOME_ENV} or pass --home")]
    NoHome,
    #[error("invalid agent id {0:?}: ids are letters, digits, '-' and '_' only")]
    InvalidAgentId(String),
    #[error("invalid conversation id {0:?}: ids are letters, digits, '-' and '_' only")]
    InvalidConversationId(String),
    #[error("invalid reflection launch id {0:?}: ids are letters, digits, '-' and '_' only")]
    InvalidLaunchId(String),
}

/// Agent ids name directories, so they are restricted to a safe alphabet.
pub fn is_valid_agent_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A single path component that is not `.`/`..` and has no `/` or NUL.
pub(crate) fn is_plain_component(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}
