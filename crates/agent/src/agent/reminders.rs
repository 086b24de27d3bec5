//! The texts of the reminders that ask the agent to act on its memory
//! (`MEMORY COMMIT NEEDED`, `MEMORY GIT CONFLICT`, `MEMORY SYNC FAILED`).
//! Each names only what the agent can do from its sandbox — a command of
//! its `memory` tool, never git or the `mini-letta` CLI, which it cannot
//! run — and names it from the tool's own constants, so a renamed command
//! cannot leave a reminder pointing at nothing.

use std::path::Path;

use super::tools::{MEMORY_COMMIT, MEMORY_REPAIR_CONFLICT};

/// Uncommitted edits in the memory checkout. `status` says how many or
/// which; `then` is what happens once they are committed (may be empty).
pub fn commit_needed(memory_dir: &Path, status: &str, then: &str) -> String {
    format!(
        "MEMORY COMMIT NEEDED: The memory repository has uncommitted changes.\n\n\
Memory directory: {}\n\
Status: {status}\n\n\
Commit them with your `memory` tool: command `{MEMORY_COMMIT}` with a `reason` (the commit \
message) commits every uncommitted change, or only the `file_paths` you name; the \
supervisor validates it as any memory commit.{}",
        memory_dir.display(),
        if then.is_empty() {
            String::new()
        } else {
            format!(" {then}")
        }
    )
}

/// A sync whose local commits conflict with the remote's. The agent hands
/// it to a repair worker; the operator's git recipe is in the README.
pub fn git_conflict(memory_dir: &Path, status: &str, backup_ref: Option<&str>) -> String {
    format!(
        "MEMORY GIT CONFLICT: Your memory changes could not be synced: they conflict with \
changes another host pushed to the remote.\n\
Memory directory: {}\n\
Status: {status}\n\
Your local memory is unchanged{}. Hand the conflict to a repair worker: call your `memory` \
tool with command `{MEMORY_REPAIR_CONFLICT}`. It re-applies your changes onto the remote's \
memory, checks that none was lost, syncs, and tells you how it ended. If it cannot, tell \
the user: the conflict then needs an operator on this host.",
        memory_dir.display(),
        backup_ref
            .map(|r| format!(" (backup ref {r})"))
            .unwrap_or_default()
    )
}

/// A sync that could not push (refused by the validator, or the push
/// failed): nothing for the agent to run, nothing lost.
pub fn sync_failed(memory_dir: &Path, status: &str) -> String {
    format!(
        "MEMORY SYNC FAILED: Your memory changes could not be pushed to the remote.\n\
Memory directory: {}\n\
Status: {status}\n\
Nothing was lost: the commits stay in local memory, and the next sync after a \
change tries again.",
        memory_dir.display()
    )
}
