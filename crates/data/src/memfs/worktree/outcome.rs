//! What a finalizer is told and what it reports: [`FinalizeOptions`],
//! [`FinalizeStatus`], [`Finalized`] and a conflict's [`ConflictSides`].

/// How a finalizer ended. Serialized in snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalizeStatus {
    /// The branch is in `main` (merged now, or already by the integration
    /// agent).
    Merged,
    /// Nothing was committed; the worktree was removed.
    NoChanges,
    /// The worktree had uncommitted changes; everything was discarded.
    DirtyUncommitted,
    /// The child failed or the integration did not happen.
    Failed,
    /// The main checkout had uncommitted changes; nothing was merged.
    ParentDirty,
    /// A content conflict (or, for workers, changes overlapping dirty
    /// checkout files); `main` is unchanged.
    MergeConflict,
    /// A cancelled memory worker; everything was thrown away.
    Discarded,
    /// mini-letta addition: the merged tree was refused by the MemFS
    /// validator (each branch commit passed, their combination with `main`
    /// did not); `main` is unchanged and `error` holds the validator's text.
    Invalid,
}

/// What a finalizer did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finalized {
    pub status: FinalizeStatus,
    pub summary: String,
    /// Commits the branch had on top of its base.
    pub commit_count: usize,
    /// The merge commit on `main`, when one was made.
    pub merge_commit: Option<String>,
    pub branch: String,
    /// The branch still exists (a worker's conflicting commits, or a branch
    /// a clean cleanup refused to delete because it was not merged).
    pub branch_kept: bool,
    /// Paths the merge changed in `main`; for a worker's `merge_conflict`,
    /// the conflicting paths; for other reflection outcomes, the paths the
    /// branch changed since its base (empty for other worker outcomes).
    pub changed_paths: Vec<String>,
    /// The underlying error, for `failed` (a refresh or worker merge that
    /// errored) and `invalid` (the validator's text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A worker's `merge_conflict` met only uncommitted edits in the main
    /// checkout (the merge itself was clean): the same change applies once
    /// they are committed, so its instruction is run again rather than
    /// repaired (a repair would meet the same edits).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkout_dirty: bool,
    /// The kept branch's tip, when a worker's branch was kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_tip: Option<String>,
    /// For `merge_conflict`: each conflicted file's three versions, so a
    /// reader (a repair, the reflection soak) can see what kind of
    /// conflict it was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<ConflictSides>,
}

impl Finalized {
    /// As `memory.merge` answers it: the same fields, the ones a reader
    /// decides on typed.
    pub fn reply(&self) -> crate::protocol::replies::Merged {
        let mut rest = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        let status = rest
            .remove("status")
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| "failed".into());
        for typed in [
            "summary",
            "commit_count",
            "merge_commit",
            "changed_paths",
            "branch",
        ] {
            rest.remove(typed);
        }
        crate::protocol::replies::Merged {
            status,
            summary: self.summary.clone(),
            commit_count: self.commit_count,
            merge_commit: self.merge_commit.clone(),
            changed_paths: self.changed_paths.clone(),
            branch: self.branch.clone(),
            rest,
        }
    }
}

/// One file a merge left conflicted: the blob ids of its merge-base
/// version and of each side (`None` where that side has no such file).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConflictSides {
    pub path: String,
    pub base: Option<String>,
    pub ours: Option<String>,
    pub theirs: Option<String>,
}

/// Inputs of [`finalize_reflection_worktree`](super::finalize::finalize_reflection_worktree)
/// (spec §4.2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinalizeOptions {
    /// The reflection child succeeded.
    pub should_merge: bool,
    /// The caller knows the run changed nothing (a missing worktree may
    /// then be finalized as a no-op).
    pub known_no_changes: bool,
    /// Explicit integration: an agent was to merge the branch itself; only
    /// check (by ancestry) that it did.
    pub require_already_merged: bool,
    /// Replaces the default summary of the `failed` rows 2 and 6.
    pub failure_summary: Option<String>,
    /// The merge commit's text after `merge(reflection): `.
    pub summary: String,
}
