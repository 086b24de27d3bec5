//! What names a memory worktree: its [`Label`], the `<label>-<id>`
//! name checked by [`parse_name`], its branch and its directories.

use std::path::PathBuf;

use git2::Oid;

use super::error::WorktreeError;
use crate::paths::{AgentPaths, MemoryGitDir};

/// Prefix of every branch this module makes (`mini-letta/<label>/<id>`).
pub const BRANCH_PREFIX: &str = "mini-letta/";

/// What a memory worktree is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Label {
    Reflection,
    MemoryWorker,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Reflection => "reflection",
            Label::MemoryWorker => "memory-worker",
        }
    }

    const ALL: [Label; 2] = [Label::Reflection, Label::MemoryWorker];
}

/// One memory worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryWorktree {
    pub label: Label,
    /// `YYYYMMDDHHMMSS-xxxxxxxx` (UTC time, 8 random hex digits).
    pub id: String,
    /// `<label>-<id>`: the directory and admin-directory name.
    pub name: String,
    /// `<agent>/memory-worktrees/<name>/`.
    pub dir: PathBuf,
    /// `mini-letta/<label>/<id>`.
    pub branch: String,
    /// The `main` commit the branch started at.
    pub base: Oid,
}

/// Whether `name` has exactly the `<label>-<YYYYMMDDHHMMSS>-<8 hex>` shape;
/// its label and id when it does.
pub fn parse_name(name: &str) -> Option<(Label, &str)> {
    Label::ALL.into_iter().find_map(|label| {
        let id = name.strip_prefix(label.as_str())?.strip_prefix('-')?;
        is_valid_id(id).then_some((label, id))
    })
}

fn is_valid_id(id: &str) -> bool {
    let b = id.as_bytes();
    b.len() == 23
        && b[..14].iter().all(u8::is_ascii_digit)
        && b[14] == b'-'
        && b[15..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

impl MemoryWorktree {
    /// The worktree named `name` (checked) with the given base.
    pub(super) fn from_name(
        agent: &AgentPaths,
        name: &str,
        base: Oid,
    ) -> Result<Self, WorktreeError> {
        let (label, id) = parse_name(name).ok_or_else(|| WorktreeError::BadName(name.into()))?;
        let dir = agent
            .memory_worktree_dir(name)
            .ok_or_else(|| WorktreeError::BadName(name.into()))?;
        Ok(MemoryWorktree {
            label,
            id: id.to_string(),
            name: name.to_string(),
            dir,
            branch: format!("{BRANCH_PREFIX}{}/{id}", label.as_str()),
            base,
        })
    }

    pub(super) fn branch_ref(&self) -> String {
        format!("refs/heads/{}", self.branch)
    }
}

/// The admin directory (`memory.git/worktrees/<name>`) of a checked name.
pub(super) fn admin_dir(agent: &AgentPaths, name: &str) -> Result<PathBuf, WorktreeError> {
    parse_name(name).ok_or_else(|| WorktreeError::BadName(name.into()))?;
    MemoryGitDir::new(&agent.memory_git_dir())
        .worktree_admin_dir(name)
        .ok_or_else(|| WorktreeError::BadName(name.into()))
}
