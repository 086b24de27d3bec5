//! Per-agent uids: when the supervisor runs as root, every agent's confined
//! processes run as a uid of their own, so plain file permissions (0700
//! agent directories) separate agents even where path-based layers cannot
//! (a hard link planted before confinement, pathname sockets).

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::agentfs::{Dir, FsError, Kind};
use crate::paths::{AGENT_OWNED_DIR_NAMES, AgentPaths, Home, OWNERSHIP_MARKER_NAME};

pub use super::subids::{UID_BASE, UID_COUNT};

/// The uid the layer probes run as: the last agent uid.
pub(crate) fn probe_uid() -> u32 {
    UID_BASE + super::subids::agent_uid_count() - 1
}

static ALLOCATION: Mutex<()> = Mutex::new(());

/// Host-wide record of the uids handed out, shared by every home (tenant)
/// on this machine so that two tenants' agents never share a uid.
pub const REGISTRY: &str = "/var/lib/mini-letta/.agent-uids";

/// A failure reading or writing the uid registry ([`registry`]).
#[derive(Debug, thiserror::Error)]
#[error("agent uid registry: {0}")]
pub struct RegistryError(#[source] pub std::io::Error);

/// The record of uids handed out: the host's ([`REGISTRY`]) as root; in a
/// user's namespace of subordinate ids ([`super::subids`]), that user's,
/// since the range is the user's alone.
pub fn registry() -> PathBuf {
    match super::subids::user_registry_path() {
        Some(p) => p.to_path_buf(),
        None => PathBuf::from(REGISTRY),
    }
}

/// Hand out the lowest uid free on this host to `agent_id` of `home` and
/// record it in the host registry. `recorded` are the uids the home's
/// agent records already name (the caller reads them: this module knows no
/// agent record); they stay taken even where the registry lacks them. The
/// caller stores the uid in the agent's record.
pub fn allocate_uid(home: &Home, agent_id: &str, recorded: &[u32]) -> Result<u32, RegistryError> {
    let _guard = ALLOCATION.lock().unwrap_or_else(|p| p.into_inner());
    let registry = registry();
    if let Some(dir) = registry.parent() {
        std::fs::create_dir_all(dir).map_err(RegistryError)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&registry)
        .map_err(RegistryError)?;
    // Serialise allocation across supervisors of different homes.
    file.lock().map_err(RegistryError)?;
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(RegistryError)?;
    // Asked again for an agent that already has one (two launches of a new
    // agent at once): the same uid, never a second.
    let root = home.root().display().to_string();
    if let Some(uid) = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ' ');
        let uid = f.next()?.parse::<u32>().ok()?;
        (f.next()? == agent_id && f.next()? == root).then_some(uid)
    }) {
        return Ok(uid);
    }
    // Every uid ever handed out stays taken, even when its agent directory
    // is not found now: a home that is moved or not mounted still has files
    // owned by that uid, which the next agent given it would own.
    let mut used: std::collections::HashSet<u32> = text
        .lines()
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect();
    used.extend(recorded.iter().copied());
    let uid = (UID_BASE..probe_uid())
        .find(|u| !used.contains(u))
        .ok_or_else(|| RegistryError(std::io::Error::other("no free agent uid left")))?;
    writeln!(file, "{uid} {agent_id} {}", home.root().display()).map_err(RegistryError)?;
    file.sync_all().map_err(RegistryError)?;
    Ok(uid)
}

/// Free the uid of a deleted agent (`agent delete`): its registry entry is
/// removed — the only way a uid is ever handed out again. Refused while any
/// process still runs as that uid. Returns whether an entry was removed.
pub fn release_uid(home: &Home, agent_id: &str, uid: u32) -> Result<bool, RegistryError> {
    use std::io::{Seek, SeekFrom};
    let _guard = ALLOCATION.lock().unwrap_or_else(|p| p.into_inner());
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(registry())
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(RegistryError(e)),
    };
    file.lock().map_err(RegistryError)?;
    if let Some(pid) = process_of_uid(uid) {
        return Err(RegistryError(std::io::Error::other(format!(
            "uid {uid} is still in use (process {pid}); stop it before deleting the agent"
        ))));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(RegistryError)?;
    let entry = format!("{uid} {agent_id} {}", home.root().display());
    let kept: Vec<&str> = text.lines().filter(|l| *l != entry).collect();
    if kept.len() == text.lines().count() {
        return Ok(false);
    }
    let mut out = kept.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    file.set_len(0).map_err(RegistryError)?;
    file.seek(SeekFrom::Start(0)).map_err(RegistryError)?;
    file.write_all(out.as_bytes()).map_err(RegistryError)?;
    file.sync_all().map_err(RegistryError)?;
    Ok(true)
}

/// Start time of process `pid` (field 22 of `/proc/<pid>/stat`), `None`
/// when there is no such process.
pub fn process_start_time(pid: u32) -> Option<u64> {
    if pid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may itself hold
    // spaces and parentheses: fields are counted after its last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    // `after` starts at field 3 (state); starttime is field 22. A zombie
    // (`Z`) or dead (`X`) process runs no more: its lock is stale even
    // while nobody has reaped it.
    let mut fields = after.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(22 - 4)?.parse().ok()
}

/// A live (not zombie) process running as `uid`, if any.
pub fn process_of_uid(uid: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        if std::fs::metadata(e.path()).ok()?.uid() != uid {
            return None;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'));
        (!zombie).then_some(pid)
    })
}

/// Wait up to `limit` for every process of `uid` to end (a killed child's
/// processes take a moment to go); the one still running, if any.
pub fn wait_uid_idle(uid: u32, limit: std::time::Duration) -> Option<u32> {
    let mut running = None;
    crate::retry::Policy::polling(std::time::Duration::from_millis(20), limit).wait_for(|| {
        running = process_of_uid(uid);
        running.is_none()
    });
    running
}

/// Directories inside the agent directory that belong to the agent's uid.
/// Everything else there (`agent.json`, `memory.git/`) stays the
/// supervisor's: the agent must not rewrite its own record (model, uid) or
/// its git directory (hooks, config, refs).
pub fn agent_owned_dirs(paths: &AgentPaths) -> Vec<PathBuf> {
    AGENT_OWNED_DIR_NAMES
        .iter()
        .map(|n| paths.dir().join(n))
        .collect()
}

/// Most entries one ownership pass looks at: a child can make its tree as
/// large as its quota allows, the supervisor's time per spawn stays bounded.
pub const ADOPT_MAX_ENTRIES: usize = 200_000;
/// Deepest directory level an ownership pass descends to (each level holds
/// one descriptor open).
pub const ADOPT_MAX_DEPTH: usize = 64;

/// Set ownership for confinement: the agent directory itself is
/// `root:<agent gid>` mode 0750 (the agent may enter it, not add or remove
/// entries; no other agent may enter), and the agent-owned directories are
/// given to the agent's uid, created if missing.
///
/// This runs as root on every spawn, inside directories the agent has been
/// writing (and may be changing right now). So it works only through
/// descriptors ([`crate::agentfs`]): each entry is pinned with an `O_PATH |
/// O_NOFOLLOW` descriptor, judged by `fstat` on that descriptor, chowned
/// through it, and descended into through it. A directory swapped for a
/// symlink mid-walk is at worst a symlink whose own owner changes; nothing
/// outside the agent directory is ever reached.
///
/// The whole tree is walked once per uid: what was there before the agent
/// had one (the seed memory, conversations made by the operator) is given
/// to it, and the agent directory records it in a marker the agent cannot
/// write ([`crate::paths::OWNERSHIP_MARKER_NAME`]). Later spawns only check
/// the top-level directories: everything mini-letta writes as root below
/// them is born the agent's ([`crate::agentfs`] gives new entries to the
/// directory's owner). A file an operator creates there by other means
/// (an editor run as root) stays root's; removing the marker makes the next
/// spawn walk the tree again.
pub fn own_agent_dir(paths: &AgentPaths, uid: u32) -> std::io::Result<()> {
    let agent = Dir::open(paths.dir()).map_err(into_io)?;
    let prepared = prepared_for(&agent) == Some(uid);
    let mut budget = ADOPT_MAX_ENTRIES;
    for name in AGENT_OWNED_DIR_NAMES {
        let sub = agent.create_dir(name, 0o755).map_err(into_io)?;
        let st = sub.stat().map_err(into_io)?;
        let mine = st.uid == uid && st.gid == uid;
        if !mine && st.uid == 0 {
            sub.chown(Some(uid), Some(uid)).map_err(into_io)?;
        }
        if !prepared && (mine || st.uid == 0) {
            adopt_below(&sub, uid, 1, &mut budget)?;
        }
    }
    agent.chown(Some(0), Some(uid)).map_err(into_io)?;
    agent.chmod(0o750).map_err(into_io)?;
    if !prepared {
        agent
            .replace_file(OWNERSHIP_MARKER_NAME, format!("{uid}\n").as_bytes(), 0o644)
            .map_err(into_io)?;
    }
    Ok(())
}

/// Give a tree the supervisor has just made inside an agent's directory (a
/// memory worktree) to the agent's uid, so its confined child can write it.
pub fn give_tree(dir: &std::path::Path, uid: u32) -> std::io::Result<()> {
    let top = Dir::open(dir).map_err(into_io)?;
    top.chown(Some(uid), Some(uid)).map_err(into_io)?;
    let mut budget = ADOPT_MAX_ENTRIES;
    adopt_below(&top, uid, 1, &mut budget)
}

/// The uid recorded in the agent directory's ownership marker.
fn prepared_for(agent: &Dir) -> Option<u32> {
    let (bytes, _) = agent.read_file_capped(OWNERSHIP_MARKER_NAME, 32).ok()?;
    std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
}

/// Give root-owned entries below `dir` to `uid`. Entries owned by anyone
/// else are left alone, and so are files with more than one link (a hard
/// link planted in this tree may point at another agent's or the host's
/// file, which must never change hands) and device nodes.
fn adopt_below(dir: &Dir, uid: u32, depth: usize, budget: &mut usize) -> std::io::Result<()> {
    let names = match dir.list(*budget) {
        Ok(n) => n,
        Err(e @ FsError::TooManyEntries { .. }) => {
            tracing::warn!("not giving the rest of the tree to uid {uid}: {e}");
            *budget = 0;
            return Ok(());
        }
        Err(e) => return Err(into_io(e)),
    };
    for name in names {
        *budget = budget.saturating_sub(1);
        // Gone since the listing (the agent is busy in its tree): skip.
        let Some(entry) = dir.entry(&name).map_err(into_io)? else {
            continue;
        };
        let st = *entry.stat();
        let mine = st.uid == uid && st.gid == uid;
        let adoptable = st.uid == 0
            && match st.kind {
                Kind::Dir => true,
                Kind::CharDevice | Kind::BlockDevice | Kind::Unknown => false,
                _ => st.nlink == 1,
            };
        if !mine && adoptable {
            entry.chown(Some(uid), Some(uid)).map_err(into_io)?;
        }
        if st.kind == Kind::Dir && (mine || adoptable) {
            if depth >= ADOPT_MAX_DEPTH {
                tracing::warn!(
                    "not giving {} to uid {uid}: deeper than {ADOPT_MAX_DEPTH} levels",
                    entry.path().display()
                );
                continue;
            }
            let sub = entry.open_dir().map_err(into_io)?;
            adopt_below(&sub, uid, depth + 1, budget)?;
        }
    }
    Ok(())
}

/// `own_agent_dir` answers in `io::Error`s (its callers' type); the
/// message keeps the path and reason, the kind keeps "not found".
fn into_io(e: FsError) -> std::io::Error {
    let kind = match &e {
        FsError::Io { source, .. } => source.kind(),
        _ => std::io::ErrorKind::Other,
    };
    std::io::Error::new(kind, e.to_string())
}

/// Let agent uids traverse (not list) the home and `agents/` so that
/// bubblewrap, running as the agent, can reach the agent's own directory.
pub fn make_traversable(home: &Home) -> std::io::Result<()> {
    // The directories above the home are the host's: never loosened here,
    // but a private one (a 0700 `/root` holding `~/.mini-letta`) would
    // stop every confined child at its first step, so say so plainly.
    check_reachable(
        home.root(),
        "reach the home",
        "put the home elsewhere (MINI_LETTA_HOME=/var/lib/mini-letta)",
    )?;
    for dir in [home.root().to_path_buf(), home.agents_dir()] {
        let meta = std::fs::metadata(&dir)?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o011 != 0o011 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o011))?;
        }
    }
    Ok(())
}

/// Fail with the reason and the fix when a directory above `path` is not
/// searchable by other uids (agent uids could not `what`).
pub fn check_reachable(path: &Path, what: &str, elsewhere: &str) -> std::io::Result<()> {
    for dir in path.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o001 == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "agent uids cannot {what} {}: {} is not searchable by others (mode {mode:o}); \
                     {elsewhere} or allow traversal (chmod o+x {})",
                    path.display(),
                    dir.display(),
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Kill every process still running as one of `uids`, this home's agent
/// uids (the caller reads them from the agent records).
///
/// Called when a supervisor starts: nothing of an agent may outlive its
/// supervisor, but a sandbox launched in the instant before the previous
/// supervisor was killed can miss its parent-death signal (bubblewrap
/// re-arms it only after its own set-up). Each agent uid belongs to one
/// home (the host-wide registry), so these processes can only be leftovers
/// of this home. Returns how many were killed.
pub fn kill_leftovers(uids: &[u32]) -> usize {
    if uids.is_empty() {
        return 0;
    }
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(meta) = std::fs::metadata(entry.path()) else {
            continue;
        };
        // The owner first: only an agent's processes have their `stat`
        // read (a supervisor starting on a busy host stats each process
        // once, and opens nothing of the others).
        if !uids.contains(&meta.uid()) {
            continue;
        }
        // Zombies are already dead (waiting for a reaper that is not us).
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true);
        if !zombie
            && nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
        {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            tracing::warn!(
                pid,
                uid = meta.uid(),
                command = comm.trim(),
                "killed a leftover agent process"
            );
            killed += 1;
        }
    }
    killed
}

/// Enter this user's namespace of per-agent uids ([`super::subids`]) when
/// agent uids could reach `home` there (as under root, a private directory
/// above it would stop every child). Call while single-threaded.
pub fn enter_subids(home: &Path) -> &'static super::subids::Status {
    let reachable = check_reachable(home, "reach the home", "put the home elsewhere")
        .map_err(|e| e.to_string());
    super::subids::enter(reachable)
}
