//! The `pre-commit` hook and the layout-policy file beside it.
//!
//! The supervisor commits through [`crate::memfs::commit`], which runs the
//! validator itself; the hook exists so that a *person* running `git commit`
//! in `memory/` is held to the same rules and sees the same messages. It is a
//! two-line `sh` script that execs this binary by absolute path with
//! `memory validate --staged`, so the hook never embeds validator code that
//! could drift from the CLI: when the binary moves (upgrade, another build),
//! the recorded path no longer matches and the next write or validation
//! rewrites the script (`.git/hooks` is not cloned either, lab 2.3).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use git2::Repository;

use super::validate::Policy;
use crate::paths::MemoryGitDir;

/// The line of the script that records which binary it calls.
pub const BINARY_MARKER: &str = "# mini-letta-binary: ";

/// Failures to write the hook or the policy file.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("{path}: cannot install the pre-commit hook: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What [`ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookStatus {
    /// Already this binary's script; nothing written.
    Current,
    /// There was no hook; ours was written.
    Installed,
    /// Ours, but for another binary path (or an older script); rewritten.
    Refreshed,
    /// A hook someone else wrote; left alone.
    Foreign,
    /// No hook and the mode said not to create one.
    Absent,
}

/// When [`ensure`] may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnsureMode {
    /// Write ours when there is none or ours is stale (memory writers).
    InstallOrRefresh,
    /// Only rewrite a stale hook of ours (`memory validate`, which may be run
    /// on any repository and must not plant hooks in it).
    RefreshOnly,
}

/// Single-quote a path for `sh` (`'` becomes `'\''`).
fn sh_quote(path: &OsStr) -> Vec<u8> {
    let mut out = vec![b'\''];
    for &b in path.as_bytes() {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    out
}

/// The hook text for `binary` (an absolute path).
pub fn script(binary: &Path) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(b"#!/bin/sh\n");
    s.extend_from_slice(
        b"# mini-letta pre-commit hook: every memory commit passes the MemFS validator.\n",
    );
    s.extend_from_slice(
        b"# Written by mini-letta and rewritten when the binary moves; do not edit.\n",
    );
    s.extend_from_slice(BINARY_MARKER.as_bytes());
    s.extend_from_slice(binary.as_os_str().as_bytes());
    s.push(b'\n');
    // Git runs the hook at the top of the working tree with GIT_INDEX_FILE
    // naming the index to judge (a temporary one for `git commit -- paths`).
    s.extend_from_slice(b"exec ");
    s.extend_from_slice(&sh_quote(binary.as_os_str()));
    s.extend_from_slice(
        b" memory validate --staged --memory-dir \"$(git rev-parse --show-toplevel)\"\n",
    );
    s
}

/// The binary path recorded in an installed hook of ours.
pub(crate) fn installed_binary(git_dir: &Path) -> Option<PathBuf> {
    let text = fs::read(MemoryGitDir::new(git_dir).pre_commit_hook()).ok()?;
    text.split(|&b| b == b'\n').find_map(|line| {
        line.strip_prefix(BINARY_MARKER.as_bytes())
            .map(|p| PathBuf::from(OsStr::from_bytes(p)))
    })
}

/// This process's executable when it is the mini-letta binary (not a test
/// harness or another program linking the library, whose path would make
/// every `git commit` run the wrong program).
pub fn self_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let exe = fs::canonicalize(&exe).unwrap_or(exe);
    let name = exe.file_name()?.to_str()?;
    (name == "mini-letta").then_some(exe)
}

/// Write the hook for `binary` unconditionally (idempotent).
pub fn install(git_dir: &Path, binary: &Path) -> Result<(), HookError> {
    let paths = MemoryGitDir::new(git_dir);
    let hooks = paths.hooks_dir();
    let target = paths.pre_commit_hook();
    let err = |source| HookError::Write {
        path: target.clone(),
        source,
    };
    fs::create_dir_all(&hooks).map_err(err)?;
    // Written 0755 under a unique temporary name and renamed, so git never
    // sees a half-written or non-executable hook (it would skip it
    // silently), and concurrent installers never share a temporary file.
    crate::fsutil::atomic_write_mode(&target, &script(binary), 0o755).map_err(err)?;
    ensure_post_commit(git_dir, EnsureMode::InstallOrRefresh)
}

/// The `post-commit` mirror hook (see [`crate::memfs::mirror`]): written
/// when absent (install mode) or when ours is out of date; a foreign hook
/// is left alone.
fn ensure_post_commit(git_dir: &Path, mode: EnsureMode) -> Result<(), HookError> {
    let target = MemoryGitDir::new(git_dir).post_commit_hook();
    let wanted = crate::memfs::mirror::hook_script();
    match fs::read(&target) {
        Ok(current) if current == wanted.as_bytes() => return Ok(()),
        Ok(current)
            if !String::from_utf8_lossy(&current).contains(crate::memfs::mirror::HOOK_MARKER) =>
        {
            return Ok(());
        }
        Ok(_) => {}
        Err(_) if mode == EnsureMode::RefreshOnly => return Ok(()),
        Err(_) => {}
    }
    crate::fsutil::atomic_write_mode(&target, wanted.as_bytes(), 0o755).map_err(|source| {
        HookError::Write {
            path: target.clone(),
            source,
        }
    })
}

/// Make sure the hook calls `binary`, writing only when needed.
pub fn ensure(git_dir: &Path, binary: &Path, mode: EnsureMode) -> Result<HookStatus, HookError> {
    let target = MemoryGitDir::new(git_dir).pre_commit_hook();
    if git_dir.join("hooks").is_dir() {
        ensure_post_commit(git_dir, mode)?;
    }
    let status = match fs::read(&target) {
        Ok(current) if current == script(binary) => return Ok(HookStatus::Current),
        Ok(_) if installed_binary(git_dir).is_some() => HookStatus::Refreshed,
        Ok(_) => return Ok(HookStatus::Foreign),
        Err(_) if mode == EnsureMode::RefreshOnly => return Ok(HookStatus::Absent),
        Err(_) => HookStatus::Installed,
    };
    install(git_dir, binary)?;
    Ok(status)
}

/// The git directory hooks and policy live in: the *common* one, so memory
/// worktrees share them with the main checkout.
pub fn common_git_dir(repo: &Repository) -> &Path {
    repo.commondir()
}

/// Record the repository's layout policy (sticky for its lifetime).
pub(crate) fn write_layout_policy(git_dir: &Path, policy: Policy) -> Result<(), HookError> {
    let path = MemoryGitDir::new(git_dir).layout_policy_file();
    crate::fsutil::atomic_write(&path, format!("{}\n", policy.as_str()).as_bytes())
        .map_err(|source| HookError::Write { path, source })
}

/// The recorded layout policy; `root-marker` when none was recorded (every
/// repository mini-letta creates is memfs-v2). An unreadable or unknown
/// value is treated as legacy, as letta-code's hook does.
pub fn read_layout_policy(git_dir: &Path) -> Policy {
    match fs::read_to_string(MemoryGitDir::new(git_dir).layout_policy_file()) {
        Ok(text) => Policy::from_policy_file(Some(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Policy::RootMarker,
        Err(_) => Policy::LegacyOnly,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn install_refresh_and_foreign() {
        let dir = tempfile::tempdir().unwrap();
        let g = dir.path();
        assert_eq!(
            ensure(g, Path::new("/x/mini-letta"), EnsureMode::RefreshOnly).unwrap(),
            HookStatus::Absent
        );
        assert_eq!(
            ensure(g, Path::new("/x/mini-letta"), EnsureMode::InstallOrRefresh).unwrap(),
            HookStatus::Installed
        );
        let hook = g.join("hooks/pre-commit");
        let mode = fs::metadata(&hook).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(installed_binary(g), Some(PathBuf::from("/x/mini-letta")));
        assert_eq!(
            ensure(g, Path::new("/x/mini-letta"), EnsureMode::RefreshOnly).unwrap(),
            HookStatus::Current
        );
        assert_eq!(
            ensure(g, Path::new("/y/it's/mini-letta"), EnsureMode::RefreshOnly).unwrap(),
            HookStatus::Refreshed
        );
        let text = fs::read_to_string(&hook).unwrap();
        assert!(text.contains("exec '/y/it'\\''s/mini-letta' memory validate --staged"));
        fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
        assert_eq!(
            ensure(g, Path::new("/x/mini-letta"), EnsureMode::InstallOrRefresh).unwrap(),
            HookStatus::Foreign
        );
    }

    #[test]
    fn policy_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_layout_policy(dir.path()), Policy::RootMarker);
        write_layout_policy(dir.path(), Policy::SharedMemory).unwrap();
        assert_eq!(read_layout_policy(dir.path()), Policy::SharedMemory);
    }
}
