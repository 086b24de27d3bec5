//! The conversation directories: opening one from the conversations
//! directory's descriptor, listing them, and reading a capped side file.

use crate::agentfs::{Dir, FsError};
use crate::paths::{AgentPaths, CONVERSATIONS_DIR_NAME};

use super::error::{ConversationError, io};

/// Largest JSON side file read (context, reminders, cached prompt).
pub const MAX_JSON_BYTES: u64 = 16 << 20;

/// The directory of conversation `id` of `agent`, opened from the
/// conversations directory's descriptor; created (with `conversations/`)
/// when `create`, else `None` when missing. `conversations/` itself sits in
/// the agent directory, which no child can write, so it alone is opened by
/// path (and not followed if it were a symlink); a child's view may not
/// include the agent directory itself, only what its profile lists.
pub fn open_dir(
    agent: &AgentPaths,
    id: &str,
    create: bool,
) -> Result<Option<Dir>, ConversationError> {
    let paths = agent.conversation(id)?;
    let convs = match Dir::open(&agent.conversations_dir()) {
        Ok(d) => d,
        Err(e) if e.is_not_found() && create => {
            std::fs::create_dir_all(agent.dir()).map_err(io(agent.dir()))?;
            Dir::open(agent.dir())?.create_dir(CONVERSATIONS_DIR_NAME, 0o777)?
        }
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let opened = if create {
        convs.create_dir(paths.id(), 0o777)
    } else {
        convs.open_dir(paths.id())
    };
    match opened {
        Ok(d) => Ok(Some(d)),
        Err(e) if !create && e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The ids of `agent`'s conversations (its conversation directories),
/// sorted; none when it has no `conversations/` yet.
pub fn list_ids(agent: &AgentPaths) -> Result<Vec<String>, ConversationError> {
    let dir = agent.conversations_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(&dir)(e)),
    };
    let mut ids: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        // Not the recall index (`.recall`) or anything else not an id.
        .filter(|n| crate::paths::is_valid_agent_id(n))
        .collect();
    ids.sort();
    Ok(ids)
}

/// The bytes of `name` in `dir` (at most `max`), or `None` when missing.
pub(crate) fn read_optional(dir: &Dir, name: &str, max: u64) -> Result<Option<Vec<u8>>, FsError> {
    match dir.read_file_capped(name, max) {
        Ok((bytes, _)) => Ok(Some(bytes)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}
