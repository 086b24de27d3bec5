//! The system prompt a step sends (spec agent-loop.md §3.1, book ch. 3/9):
//! compile once per conversation and keep the bytes stable for the
//! provider's prompt cache.
//!
//! * no cache, or the raw system prompt changed, or a recompile was asked
//!   for → compile, store, send it;
//! * same raw prompt and same memory revision → send the cached `content`
//!   verbatim;
//! * same raw prompt, new memory revision → keep sending the cached
//!   `content`, record the new `coreMemory`/revision in the cache, and hand
//!   the turn loop one `<memory_update>`, which it stores in the
//!   conversation (a user message of system reminders, book ch. 9 ex. 3):
//!   every later request carries it with the history, none generates it
//!   again, and no request goes out with stale memory. It shows only the
//!   memory files that changed since the revision the cache held (ch. 9
//!   ex. 2); when the rendered memory did not change at all (an on-demand
//!   file was edited), there is no update.

use time::OffsetDateTime;

use super::StoreError;
use super::record::AgentRecord;
use super::system_prompt_file::{self, CachedPrompt};
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

/// A memory update to store and send, for a new revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryUpdate {
    pub revision: Option<String>,
    /// The `<memory_update>…</memory_update>` text.
    pub text: String,
}

/// What a step sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPrompt {
    /// The system prompt (prompt-cache stable).
    pub system: String,
    /// A `<memory_update>` the turn loop stores and sends, if memory changed.
    pub memory_update: Option<MemoryUpdate>,
    /// Whether this step compiled afresh.
    pub recompiled: bool,
    /// Said to the agent when HEAD's tree fails the validator and the
    /// prompt shows the last valid revision instead (book ch. 7 ex. 2).
    pub notice: Option<String>,
}

/// How many first-parent ancestors are tried for a valid revision.
const FALLBACK_DEPTH: usize = 200;

/// The revision to compile: HEAD when its tree passes the validator's
/// audit, else the newest first-parent ancestor that does, with a notice
/// for the agent. Only what is committed *and* valid is shown.
fn valid_revision(
    repo: &git2::Repository,
    head: git2::Oid,
) -> Result<(git2::Oid, Option<String>), PromptError> {
    use crate::memfs::validate::{ValidateOptions, audit_revision};
    let opts = ValidateOptions::default();
    let failure = match audit_revision(repo, &head.to_string(), &opts) {
        Ok(r) if r.is_ok() => return Ok((head, None)),
        Ok(r) => r
            .messages()
            .first()
            .map(|m| m.to_string())
            .unwrap_or_default(),
        Err(e) => e.to_string(),
    };
    let mut walk = repo.revwalk().map_err(|e| RepoError::git(repo.path(), e))?;
    walk.push(head)
        .map_err(|e| RepoError::git(repo.path(), e))?;
    walk.simplify_first_parent()
        .map_err(|e| RepoError::git(repo.path(), e))?;
    let short = |o: git2::Oid| o.to_string()[..7].to_string();
    for oid in walk.skip(1).take(FALLBACK_DEPTH).flatten() {
        if audit_revision(repo, &oid.to_string(), &opts).is_ok_and(|r| r.is_ok()) {
            let notice = invalid_revision_notice(&short(head), &failure, Some(&short(oid)));
            return Ok((oid, Some(notice)));
        }
    }
    // Nothing valid to fall back to: HEAD as it is, and say so.
    Ok((
        head,
        Some(invalid_revision_notice(&short(head), &failure, None)),
    ))
}

/// The `MEMORY REVISION INVALID` reminder: HEAD fails the validator with
/// `failure`; the prompt shows revision `shown` (or HEAD as it is).
pub fn invalid_revision_notice(head: &str, failure: &str, shown: Option<&str>) -> String {
    let what = match shown {
        Some(rev) => format!(
            "Your system prompt shows the last valid revision, {rev}, so memory committed after it is \
             not shown. Fix the files named above and commit; the next valid commit is shown again."
        ),
        None => {
            "No earlier valid revision was found, so your system prompt shows HEAD as it is. Fix \
                 the files named above and commit."
                .to_string()
        }
    };
    format!(
        "MEMORY REVISION INVALID: HEAD ({head}) does not pass the memory validator: {failure}\n\n{what}"
    )
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
pub(crate) fn memory_update_text(revision: Option<&str>, core_memory: &str) -> String {
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

/// The `<memory_update>` for a move from revision `old` to `fresh`: only
/// the blocks of files that changed (memfs-v2), with the files removed
/// named; the whole memory when the change cannot be cut that way
/// (memfs-v1, an unknown old revision, a change outside the blocks).
fn delta_update(agent: &AgentPaths, old: Option<&str>, fresh: &CompiledPrompt) -> String {
    let full = || memory_update_text(fresh.memfs_revision.as_deref(), &fresh.core_memory);
    let (Some(old), Some(new)) = (old, fresh.memfs_revision.as_deref()) else {
        return full();
    };
    let Ok(repo) = repo::open_agent(agent) else {
        return full();
    };
    let (Ok(changed), Ok(Some(blocks))) = (
        crate::memfs::ops::changed_paths(&repo, old, new),
        crate::memfs::compiler::projection_blocks(&repo),
    ) else {
        return full();
    };
    let shown: Vec<&str> = blocks
        .iter()
        .filter(|b| b.paths.iter().any(|p| changed.contains(p)))
        .map(|b| b.text.as_str())
        .collect();
    let present: Vec<&String> = blocks.iter().flat_map(|b| &b.paths).collect();
    // Core files (root `.md` files, child indexes) that are gone now.
    let removed: Vec<&String> = changed
        .iter()
        .filter(|p| p.ends_with(".md") && (!p.contains('/') || p.ends_with("/MEMORY.md")))
        .filter(|p| !present.contains(p))
        .collect();
    if shown.is_empty() && removed.is_empty() {
        return full();
    }
    let mut lines = vec![
        "<memory_update>".to_string(),
        format!("The local memory filesystem has been edited and committed at revision {new}."),
        "Only the memory files that changed since the last update are shown; each replaces the \
         version shown earlier in this conversation (trust this one where they differ), and \
         memory not shown here is unchanged."
            .to_string(),
    ];
    if !removed.is_empty() {
        let names: Vec<&str> = removed.iter().map(|p| p.as_str()).collect();
        lines.push(format!("Removed: {}.", names.join(", ")));
    }
    lines.push(String::new());
    lines.push(shown.join("\n\n"));
    lines.push("</memory_update>".to_string());
    lines.join("\n")
}

/// Resolve the prompt of one step.
pub fn resolve(
    agent: &AgentPaths,
    record: &AgentRecord,
    conversation: &str,
    message_count: u64,
    recompile: bool,
) -> Result<StepPrompt, PromptError> {
    let repo = repo::open_agent(agent)?;
    let head = repo.head().ok().and_then(|h| h.target());
    let cached = if recompile {
        None
    } else {
        system_prompt_file::load(agent, conversation)?
    };
    // Nothing changed since the cache was written (its revision was
    // audited then): the cached bytes, without compiling again.
    if let Some(c) = &cached
        && c.memfs_revision == head.map(|h| h.to_string())
        && c.raw_system_hash == crate::memfs::compiler::sha256_hex(record.system.as_bytes())
    {
        return Ok(StepPrompt {
            system: c.content.clone(),
            memory_update: None,
            recompiled: false,
            notice: None,
        });
    }
    let (revision, notice) = match head {
        Some(h) => {
            let (r, n) = valid_revision(&repo, h)?;
            (Some(r), n)
        }
        None => (None, None),
    };
    let opts = CompileOptions {
        agent_id: &record.id,
        conversation_id: conversation,
        system: &record.system,
        now: OffsetDateTime::now_utc(),
        previous_message_count: message_count,
    };
    let fresh = match revision {
        Some(r) => crate::memfs::compiler::compile_commit(&repo, r, &opts)?,
        None => compile_repo(&repo, &opts)?,
    };
    drop(repo);
    match cached {
        Some(c) if c.raw_system_hash == fresh.raw_system_hash => {
            if c.memfs_revision == fresh.memfs_revision {
                return Ok(StepPrompt {
                    system: c.content,
                    memory_update: None,
                    recompiled: false,
                    notice,
                });
            }
            let update = (c.core_memory != fresh.core_memory).then(|| MemoryUpdate {
                revision: fresh.memfs_revision.clone(),
                text: delta_update(agent, c.memfs_revision.as_deref(), &fresh),
            });
            let kept = CachedPrompt {
                content: c.content.clone(),
                ..to_cache(&fresh)
            };
            system_prompt_file::store(agent, conversation, &kept)?;
            Ok(StepPrompt {
                system: c.content,
                memory_update: update,
                recompiled: false,
                notice,
            })
        }
        _ => {
            system_prompt_file::store(agent, conversation, &to_cache(&fresh))?;
            Ok(StepPrompt {
                system: fresh.content,
                memory_update: None,
                recompiled: true,
                notice,
            })
        }
    }
}
