//! The system prompt a step sends (spec agent-loop.md §3.1, book ch. 3/9):
//! compile once per conversation and keep the bytes stable for the
//! provider's prompt cache.
//!
//! * no cache, or the raw system prompt changed, or a recompile was asked
//!   for → compile, store, send it;
//! * same raw prompt and same memory revision → send the cached `content`
//!   verbatim;
//! * same raw prompt, new memory revision → keep sending the cached
//!   `content`, record the new `coreMemory`/revision in the cache, and add
//!   one `<memory_update>` to this request only (the cache now holds the new
//!   revision, so the update is sent once).

use time::OffsetDateTime;

use super::cache::{self, CachedPrompt};
use super::record::AgentRecord;
use super::store::StoreError;
use crate::memfs::compiler::{CompileOptions, CompiledPrompt, compile_repo};
use crate::memfs::repo::{self, RepoError};
use crate::paths::AgentPaths;

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a step sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPrompt {
    /// The system prompt (prompt-cache stable).
    pub system: String,
    /// A one-time `<memory_update>` to send after it, if memory changed.
    pub memory_update: Option<String>,
    /// Whether this step compiled afresh.
    pub recompiled: bool,
}

/// Compile the agent's prompt now.
pub fn compile_now(
    agent: &AgentPaths,
    record: &AgentRecord,
    conversation: &str,
    message_count: u64,
) -> Result<CompiledPrompt, PromptError> {
    let repo = repo::open_agent(agent)?;
    Ok(compile_repo(
        &repo,
        &CompileOptions {
            agent_id: &record.id,
            conversation_id: conversation,
            system: &record.system,
            now: OffsetDateTime::now_utc(),
            previous_message_count: message_count,
        },
    )?)
}

fn to_cache(c: &CompiledPrompt) -> CachedPrompt {
    CachedPrompt {
        content: c.content.clone(),
        core_memory: c.core_memory.clone(),
        compiled_at: c.compiled_at.clone(),
        raw_system_hash: c.raw_system_hash.clone(),
        memfs_revision: c.memfs_revision.clone(),
    }
}

/// The `<memory_update>` text for a new revision.
pub fn memory_update_text(revision: Option<&str>, core_memory: &str) -> String {
    [
        "<memory_update>".to_string(),
        format!(
            "The local memory filesystem has been edited and committed at revision {}.",
            revision.unwrap_or("unknown")
        ),
        "The memory below replaces the memory shown earlier in this conversation; where the two differ, \
         trust this version."
            .to_string(),
        String::new(),
        crate::memfs::text::js_trim_end(core_memory).to_string(),
        "</memory_update>".to_string(),
    ]
    .join("\n")
}

/// Resolve the prompt of one step.
pub fn resolve(
    agent: &AgentPaths,
    record: &AgentRecord,
    conversation: &str,
    message_count: u64,
    recompile: bool,
) -> Result<StepPrompt, PromptError> {
    let fresh = compile_now(agent, record, conversation, message_count)?;
    let cached = if recompile {
        None
    } else {
        cache::load(agent, conversation)?
    };
    match cached {
        Some(c) if c.raw_system_hash == fresh.raw_system_hash => {
            if c.memfs_revision == fresh.memfs_revision {
                return Ok(StepPrompt {
                    system: c.content,
                    memory_update: None,
                    recompiled: false,
                });
            }
            let update = memory_update_text(fresh.memfs_revision.as_deref(), &fresh.core_memory);
            let kept = CachedPrompt {
                content: c.content.clone(),
                ..to_cache(&fresh)
            };
            cache::store(agent, conversation, &kept)?;
            Ok(StepPrompt {
                system: c.content,
                memory_update: Some(update),
                recompiled: false,
            })
        }
        _ => {
            cache::store(agent, conversation, &to_cache(&fresh))?;
            Ok(StepPrompt {
                system: fresh.content,
                memory_update: None,
                recompiled: true,
            })
        }
    }
}

/// Forget the cached prompt so the next step recompiles (`recompile`,
/// compaction, a changed system prompt).
pub fn invalidate(agent: &AgentPaths, conversation: &str) -> Result<(), PromptError> {
    let Ok(c) = agent.conversation(conversation) else {
        return Ok(());
    };
    let path = c.system_prompt_json();
    let io = |source| StoreError::Io {
        path: path.clone(),
        source,
    };
    // Reached by descriptor: the conversation directory is the agent's.
    let dir = match super::conversation::open_dir(agent, conversation, false) {
        Ok(Some(d)) => d,
        Ok(None) => return Ok(()),
        Err(e) => return Err(io(std::io::Error::other(e.to_string())).into()),
    };
    match dir.remove_file(crate::paths::SYSTEM_PROMPT_FILE_NAME) {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(io(std::io::Error::other(e.to_string())).into()),
    }
}
