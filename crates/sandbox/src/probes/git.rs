//! Code planted for the unconfined side: git hooks and config of the own
//! memory repository, shell rc and tool config files read later outside
//! (§d rows 42–44). Existing files are only opened for appending (nothing
//! written); new files have unique names and are deleted at once.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::context::ProbeContext;
use super::util::{io_name, join, private_tmpfs, unique};
use super::verdict::Verdict;

/// Create `path` (must not exist); remove it again on success.
fn create_then_remove(path: &Path) -> Result<(), String> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(path)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(path);
            Ok(())
        }
        Err(e) => Err(format!("create {}: {}", path.display(), io_name(&e))),
    }
}

/// Open an existing file for appending; nothing is written.
fn open_append(path: &Path) -> Result<(), String> {
    OpenOptions::new()
        .append(true)
        .open(path)
        .map(drop)
        .map_err(|e| format!("open {} for writing: {}", path.display(), io_name(&e)))
}

/// Row 42: create `hooks/post-merge` in the own `memory.git` (a uniquely
/// named hook if one exists; `hooks/` itself if it is missing). Escaped if
/// anything is created there (removed at once).
pub(crate) fn hook_write(ctx: &ProbeContext) -> Verdict {
    let hooks = ctx.own_memory_git_dir.join("hooks");
    if !hooks.is_dir() {
        return match std::fs::create_dir(&hooks) {
            Ok(()) => {
                let _ = std::fs::remove_dir(&hooks);
                Verdict::escaped(format!("created {} (removed)", hooks.display()))
            }
            Err(e) => Verdict::blocked(format!("mkdir {}: {}", hooks.display(), io_name(&e))),
        };
    }
    let hook = hooks.join("post-merge");
    let target = if hook.exists() {
        hooks.join(unique("hook"))
    } else {
        hook
    };
    match create_then_remove(&target) {
        Ok(()) => Verdict::escaped(format!("created the hook {} (removed)", target.display())),
        Err(e) => Verdict::blocked(e),
    }
}

/// Row 43: open the own `memory.git/config` for writing and create a file
/// beside it (how git rewrites config: a lock file renamed over it).
/// Escaped if either works (nothing written; the new file is removed).
pub(crate) fn config_write(ctx: &ProbeContext) -> Verdict {
    let config = ctx.own_memory_git_dir.join("config");
    let mut got = Vec::new();
    let mut refused = Vec::new();
    if config.exists() {
        match open_append(&config) {
            Ok(()) => got.push(format!(
                "opened {} for writing (core.hooksPath/core.fsmonitor/core.sshCommand could be set; nothing written)",
                config.display()
            )),
            Err(e) => refused.push(e),
        }
    } else {
        refused.push(format!("{}: absent", config.display()));
    }
    let beside = ctx.own_memory_git_dir.join(unique("config"));
    match create_then_remove(&beside) {
        Ok(()) => got.push(format!(
            "created {} beside it (a config.lock could replace config)",
            beside.display()
        )),
        Err(e) => refused.push(e),
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Row 44: write shell rc / tool config files in home directories that an
/// unconfined process reads later: `$HOME` unless it lies inside the own
/// agent dir (the agent's own), and `/root`. Existing `.bashrc`, `.profile`, `.gitconfig`, `.mcp.json`
/// are opened for appending; a new dotfile is created and removed.
/// Escaped if any of this works; a home that is a tmpfs mask private to
/// the sandbox is not attacked (nothing there is read outside).
pub(crate) fn rc_poisoning(ctx: &ProbeContext) -> Verdict {
    let mut homes: Vec<PathBuf> = Vec::new();
    let mut notes = Vec::new();
    match std::env::var_os("HOME").map(PathBuf::from) {
        Some(h) if h.starts_with(&ctx.own_agent_dir) => {
            notes.push(format!("HOME {} is the agent's own", h.display()));
        }
        Some(h) => homes.push(h),
        None => notes.push("HOME unset".into()),
    }
    homes.push("/root".into());
    homes.dedup();
    let mut got = Vec::new();
    let mut refused = Vec::new();
    for home in &homes {
        if private_tmpfs(home, ctx.supervisor_pid) {
            notes.push(format!(
                "{} is a tmpfs mask private to this sandbox",
                home.display()
            ));
            continue;
        }
        for name in [".bashrc", ".profile", ".gitconfig", ".mcp.json"] {
            let p = home.join(name);
            if p.is_file() {
                match open_append(&p) {
                    Ok(()) => got.push(format!(
                        "opened {} for writing (nothing written)",
                        p.display()
                    )),
                    Err(e) => refused.push(e),
                }
            }
        }
        match create_then_remove(&home.join(unique("rc"))) {
            Ok(()) => got.push(format!("created a dotfile in {} (removed)", home.display())),
            Err(e) => refused.push(e),
        }
    }
    refused.extend(notes.iter().cloned());
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        got.extend(notes);
        Verdict::escaped(join(&got))
    }
}

/// Row 66: a sub-agent (reflection, memory worker) edits only its own
/// worktree; the agent's main checkout is read-only to it (the supervisor
/// merges). Create a file in the checkout and open an existing one for
/// writing: escaped if either works (nothing written, the file removed).
pub(crate) fn main_checkout_write(ctx: &ProbeContext) -> Verdict {
    let Some(checkout) = &ctx.read_only_checkout else {
        return Verdict::skipped("this role may write the agent's checkout (not a sub-agent)");
    };
    let mut got = Vec::new();
    let mut refused = Vec::new();
    match create_then_remove(&checkout.join(unique("edit"))) {
        Ok(()) => got.push(format!(
            "created a file in {} (removed)",
            checkout.display()
        )),
        Err(e) => refused.push(e),
    }
    let existing = std::fs::read_dir(checkout).ok().and_then(|rd| {
        rd.flatten()
            .map(|e| e.path())
            .find(|p| p.is_file() && p.extension().is_some_and(|x| x == "md"))
    });
    match existing {
        Some(file) => match open_append(&file) {
            Ok(()) => got.push(format!(
                "opened {} for writing (nothing written)",
                file.display()
            )),
            Err(e) => refused.push(e),
        },
        None => refused.push(format!("{}: no memory file visible", checkout.display())),
    }
    if got.is_empty() {
        Verdict::blocked(refused.join("; "))
    } else {
        Verdict::escaped(got.join("; "))
    }
}

/// Row 67: plant, in the own `memory.git`, what would make root read
/// beyond the repository: `objects/info/alternates` (another agent's
/// objects), `info/grafts` and `shallow` (rewritten history), a replace
/// ref, an object. Escaped if anything is created or opened for writing
/// (removed at once, nothing written). A missing directory on the way is
/// attacked instead (created and removed).
pub(crate) fn object_store_plant(ctx: &ProbeContext) -> Verdict {
    let git = &ctx.own_memory_git_dir;
    let targets = [
        ("objects/info", "alternates".to_string()),
        ("info", "grafts".to_string()),
        ("", "shallow".to_string()),
        ("refs/replace", unique("replace")),
        ("objects", unique("object")),
    ];
    let mut got = Vec::new();
    let mut refused = Vec::new();
    for (dir, name) in targets {
        match plant_in(git, dir, &name) {
            Ok(done) => got.push(done),
            Err(e) => refused.push(e),
        }
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Create `name` in `git/dir` (or open it for appending when it exists);
/// when a directory of `dir` is missing, create that directory instead.
/// What was done (and undone) on success.
fn plant_in(git: &Path, dir: &str, name: &str) -> Result<String, String> {
    let mut at = git.to_path_buf();
    for part in dir.split('/').filter(|p| !p.is_empty()) {
        at.push(part);
        if !at.is_dir() {
            return match std::fs::create_dir(&at) {
                Ok(()) => {
                    let _ = std::fs::remove_dir(&at);
                    Ok(format!("created {} (removed)", at.display()))
                }
                Err(e) => Err(format!("mkdir {}: {}", at.display(), io_name(&e))),
            };
        }
    }
    let file = at.join(name);
    if file.exists() {
        open_append(&file)
            .map(|()| format!("opened {} for writing (nothing written)", file.display()))
    } else {
        create_then_remove(&file).map(|()| format!("created {} (removed)", file.display()))
    }
}
