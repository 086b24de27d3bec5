//! Files mini-letta keeps in a memory repository's (common) git directory
//! ([`MemoryGitDir`]): hooks, the layout policy, the writers' lock,
//! worktree admin and staging directories.

use std::path::{Path, PathBuf};

use super::error::is_plain_component;

/// Files mini-letta keeps inside a memory repository's (common) git
/// directory. The git directory may belong to an agent or be any repository
/// given with `--memory-dir`, so these hang off the git directory itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryGitDir {
    dir: PathBuf,
}

/// Name of the layout-policy file in the git directory.
pub const LAYOUT_POLICY_FILE_NAME: &str = "mini-letta-memory-layout-policy";
/// Name of the writers' lock file in the git directory.
pub const WRITE_LOCK_FILE_NAME: &str = "mini-letta-memory.lock";
/// Git's directory of linked-worktree admin directories.
pub const WORKTREE_ADMIN_DIR_NAME: &str = "worktrees";
/// Where new memory worktrees are checked out before being moved into the
/// child-writable `memory-worktrees/` (inside the git directory, which
/// children cannot change while it is being filled).
pub const WORKTREE_STAGING_DIR_NAME: &str = "mini-letta-worktree-staging";
/// File in a worktree's admin directory recording the commit it started at.
pub const WORKTREE_BASE_FILE_NAME: &str = "mini-letta-base";

impl MemoryGitDir {
    /// The (common) git directory of a memory repository.
    pub fn new(git_dir: &Path) -> Self {
        Self {
            dir: git_dir.to_path_buf(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn hooks_dir(&self) -> PathBuf {
        self.dir.join("hooks")
    }

    pub fn pre_commit_hook(&self) -> PathBuf {
        self.hooks_dir().join("pre-commit")
    }

    pub fn post_commit_hook(&self) -> PathBuf {
        self.hooks_dir().join("post-commit")
    }

    /// The repository's own (local) git configuration.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("config")
    }

    /// `objects/`: the repository's own object store.
    pub fn objects_dir(&self) -> PathBuf {
        self.dir.join("objects")
    }

    /// Files through which git reads objects or history from outside the
    /// repository's own store, each with what it does. mini-letta never
    /// makes one; every root open refuses a repository holding any
    /// (`memfs::repo`), and an import never takes them.
    pub fn foreign_history_files(&self) -> [(PathBuf, &'static str); 4] {
        let objects = self.objects_dir();
        [
            (
                objects.join("info").join("alternates"),
                "reads objects from other repositories",
            ),
            (
                objects.join("info").join("http-alternates"),
                "reads objects from other repositories",
            ),
            (
                self.dir.join("info").join("grafts"),
                "rewrites the parents of commits",
            ),
            (self.dir.join("shallow"), "cuts history off"),
        ]
    }

    /// The note left while `main` and the checkout move together
    /// (`memfs::worktree::advance`), so a kill in between can be finished.
    pub fn main_move_journal(&self) -> PathBuf {
        self.dir.join("mini-letta-main-move")
    }

    /// The post-commit mirror's log (`mini-letta.memoryRepository.url`).
    pub fn mirror_log(&self) -> PathBuf {
        self.dir.join("mirror.log")
    }

    /// One line: `root-marker`, `legacy-only` or `shared-memory`.
    pub fn layout_policy_file(&self) -> PathBuf {
        self.dir.join(LAYOUT_POLICY_FILE_NAME)
    }

    /// `flock`ed by every writer around index and commit updates.
    pub fn write_lock_file(&self) -> PathBuf {
        self.dir.join(WRITE_LOCK_FILE_NAME)
    }

    /// `worktrees/`: git's admin directories of linked worktrees.
    pub fn worktree_admin_root(&self) -> PathBuf {
        self.dir.join(WORKTREE_ADMIN_DIR_NAME)
    }

    /// The admin directory of linked worktree `name` (`None` unless `name`
    /// is a single plain component).
    pub fn worktree_admin_dir(&self, name: &str) -> Option<PathBuf> {
        is_plain_component(name).then(|| self.worktree_admin_root().join(name))
    }

    /// Where memory worktrees are filled before being moved into place.
    pub fn worktree_staging_dir(&self) -> PathBuf {
        self.dir.join(WORKTREE_STAGING_DIR_NAME)
    }

    /// Worktree `name` while it is being filled (see
    /// [`Self::worktree_staging_dir`]).
    pub fn worktree_staging(&self, name: &str) -> Option<PathBuf> {
        is_plain_component(name).then(|| self.worktree_staging_dir().join(name))
    }

    /// The commit memory worktree `name` started at (in its admin directory).
    pub fn worktree_base_file(&self, name: &str) -> Option<PathBuf> {
        Some(self.worktree_admin_dir(name)?.join(WORKTREE_BASE_FILE_NAME))
    }

    /// Git's record of where worktree `name`'s `.git` file is.
    pub fn worktree_gitdir_file(&self, name: &str) -> Option<PathBuf> {
        Some(self.worktree_admin_dir(name)?.join("gitdir"))
    }
}
