//! The agents' data: their records (`agent.json`), the name index, their
//! conversations and logs, archives, and the cached system prompt. A
//! library read by every process of the design (the CLI, the supervisor,
//! the agent child, Palace); it uses memfs and paths and runs nothing.
//!
//! This file holds the store itself: creating, listing and finding agents
//! under a home directory.

pub mod archive;
pub mod conversation;
pub mod index;
pub mod prompt_cache;
pub mod record;
pub mod system_prompt_file;

use std::fs;
use std::path::PathBuf;

use git2::Signature;
use rand::RngCore;

pub use self::record::MAX_NAME_CHARS;
use self::record::{AgentRecord, DEFAULT_MODEL, DEFAULT_SYSTEM_PROMPT, ModelSource};
use crate::fsutil::atomic_write;
use crate::memfs::hook::{self, HookError};
use crate::memfs::repo::{self, RepoError};
use crate::memfs::template::{INITIAL_COMMIT_MESSAGE, initial_files};
use crate::memfs::validate::Policy;
use crate::paths::{AgentPaths, Home, PathsError};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("an agent named {0:?} already exists")]
    NameTaken(String),
    #[error("agent names must be 1–100 characters without control characters")]
    InvalidName,
    #[error("agent name {name:?} {why}: names must not hold control or bidirectional characters")]
    UnsafeName { name: String, why: String },
    #[error("no agent {0:?} (see `mini-letta agent list`)")]
    NotFound(String),
    /// Its directory is there but its record cannot be read.
    #[error("agent {agent:?} exists but cannot be read: {reason}")]
    Unreadable { agent: String, reason: String },
    #[error("{path}: the record names agent {found:?}, not the directory's {expected:?}")]
    IdMismatch {
        path: PathBuf,
        expected: String,
        found: String,
    },
    #[error("cannot lock the agents' names ({path}): {source}")]
    NamesLock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no agents yet: create one with `mini-letta agent create NAME`")]
    NoAgents,
    #[error("several agents exist ({0}); choose one with -a")]
    Ambiguous(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: invalid agent record: {source}")]
    BadRecord {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Paths(#[from] PathsError),
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Hook(#[from] HookError),
    #[error("cannot create the memory commit signature: {0}")]
    Signature(git2::Error),
    #[error(transparent)]
    Volume(#[from] crate::sandbox::volume::VolumeError),
    #[error(transparent)]
    UidRegistry(#[from] crate::sandbox::identity::RegistryError),
}

fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A random `agent-<uuid v4>` id.
pub(crate) fn new_agent_id() -> String {
    new_prefixed_id("agent")
}

/// A random `<prefix>-<uuid v4>` id (`conv-…`, `run-…`, `message-…`: the
/// forms letta-code's clients know).
pub fn new_prefixed_id(prefix: &str) -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The signature memory commits made on the agent's behalf carry.
pub fn agent_signature(record: &AgentRecord) -> Result<Signature<'static>, StoreError> {
    Signature::now(&record.name, &format!("{}@mini-letta.local", record.id))
        .map_err(StoreError::Signature)
}

/// The identity merges and replayed commits made for an agent carry: the
/// agent's, as for its other memory commits, else a generic supervisor one
/// (a record that cannot be read, a name git refuses). memfs takes it from
/// its caller: the memory core knows no agent.
pub fn commit_signature(agent: &AgentPaths) -> Result<Signature<'static>, git2::Error> {
    if let Ok(record) = load(agent)
        && let Ok(sig) = agent_signature(&record)
    {
        return Ok(sig);
    }
    Signature::now("mini-letta", "mini-letta@mini-letta.local")
}

/// Create an agent: its directory, `agent.json`, and a memory repository with
/// one initial commit. The directory is built under a temporary name and
/// renamed into place, so a crash never leaves a half-made agent behind.
pub fn create(home: &Home, name: &str, system: Option<String>) -> Result<AgentRecord, StoreError> {
    create_with_quota(home, name, system, None)
}

/// [`create`], the agent's directory on a volume of its own when `quota`
/// is given (see `sandbox::volume`).
pub(crate) fn create_with_quota(
    home: &Home,
    name: &str,
    system: Option<String>,
    quota: Option<crate::sandbox::volume::Quota>,
) -> Result<AgentRecord, StoreError> {
    create_with(home, name, system, quota, None)
}

/// [`create_with_quota`] with the model handle the record names (`mock`
/// when `None`). The caller checks the handle's form
/// (`model::factory::parse_handle`); the store knows no providers.
pub(crate) fn create_with(
    home: &Home,
    name: &str,
    system: Option<String>,
    quota: Option<crate::sandbox::volume::Quota>,
    model: Option<&str>,
) -> Result<AgentRecord, StoreError> {
    create_with_settings(home, name, system, quota, model, serde_json::Map::new())
}

/// [`create_with`], the record's `model_settings` given (e.g. its
/// `context_window_limit`).
pub(crate) fn create_with_settings(
    home: &Home,
    name: &str,
    system: Option<String>,
    quota: Option<crate::sandbox::volume::Quota>,
    model: Option<&str>,
    model_settings: serde_json::Map<String, serde_json::Value>,
) -> Result<AgentRecord, StoreError> {
    let chosen = model.map(|m| (m, ModelSource::Flag));
    create_choosing(home, name, system, quota, chosen, model_settings)
}

/// [`create_with_settings`], with where the model came from (`None`: the
/// built-in default).
pub fn create_choosing(
    home: &Home,
    name: &str,
    system: Option<String>,
    quota: Option<crate::sandbox::volume::Quota>,
    model: Option<(&str, ModelSource)>,
    model_settings: serde_json::Map<String, serde_json::Value>,
) -> Result<AgentRecord, StoreError> {
    check_name(name)?;
    let _names = lock_names(home)?;
    if list_all(home)?.name_taken(name, None) {
        return Err(StoreError::NameTaken(name.to_string()));
    }

    let record = AgentRecord {
        id: new_agent_id(),
        name: name.to_string(),
        description: None,
        system: system.unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string()),
        tags: Vec::new(),
        model: model.map_or(DEFAULT_MODEL, |(m, _)| m).to_string(),
        model_settings,
        created_at: crate::clock::js_iso(crate::clock::now()),
        sandbox_uid: None,
        quota,
        compaction_settings: None,
        model_source: Some(model.map_or(ModelSource::Builtin, |(_, s)| s)),
    };
    let staging = home.agent_staging(&record.id)?;
    match build_agent_dir(&staging, &record) {
        Ok(()) => {
            place_agent_dir(home, &record, staging.dir())?;
            reindex(home);
            Ok(record)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(staging.dir());
            Err(e)
        }
    }
}

/// Move a complete agent directory built at `staging` (in `agents/`) to its
/// final place — onto a quota volume of its own when the record has a quota
/// — never replacing a directory already there. `staging` is gone
/// afterwards, whatever the outcome.
pub fn place_agent_dir(
    home: &Home,
    record: &AgentRecord,
    staging: &std::path::Path,
) -> Result<(), StoreError> {
    let final_paths = home.agent(&record.id)?;
    let placed = match record.quota {
        None => nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            staging,
            nix::fcntl::AT_FDCWD,
            final_paths.dir(),
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        )
        .map_err(|e| io(final_paths.dir())(e.into())),
        Some(q) => crate::sandbox::volume::create(home, &record.id, staging, final_paths.dir(), q)
            .map_err(StoreError::from),
    };
    if placed.is_err() || record.quota.is_some() {
        let _ = fs::remove_dir_all(staging);
    }
    placed
}

/// Names are 1–100 characters without control characters.
pub fn check_name(name: &str) -> Result<(), StoreError> {
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(StoreError::InvalidName);
    }
    // A name is printed on terminals and in file names (exports): no
    // control sequence, no bidirectional trick.
    crate::names::check(name).map_err(|why| StoreError::UnsafeName {
        name: name.to_string(),
        why,
    })
}

/// Held while agents' names change (create, rename, import): one process
/// at a time checks a name is free and takes it. Released on drop.
pub struct NamesLock {
    _file: fs::File,
}

pub fn lock_names(home: &Home) -> Result<NamesLock, StoreError> {
    // `agents/` too: every caller goes on to write there.
    let agents = home.agents_dir();
    fs::create_dir_all(&agents).map_err(io(&agents))?;
    let path = home.agents_names_lock();
    let lock_err = |source| StoreError::NamesLock {
        path: path.clone(),
        source,
    };
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(lock_err)?;
    file.lock().map_err(lock_err)?;
    Ok(NamesLock { _file: file })
}

/// Give agent `selector` the name `new_name` (unique among all agents,
/// those whose record cannot be read included). Returns the old name and
/// the updated record.
pub fn rename(
    home: &Home,
    selector: &str,
    new_name: &str,
) -> Result<(String, AgentRecord), StoreError> {
    check_name(new_name)?;
    let _names = lock_names(home)?;
    let (mut record, paths) = find(home, Some(selector))?;
    let old = record.name.clone();
    if old == new_name {
        return Ok((old, record));
    }
    if list_all(home)?.name_taken(new_name, Some(&record.id)) {
        return Err(StoreError::NameTaken(new_name.to_string()));
    }
    record.name = new_name.to_string();
    save(&paths, &record)?;
    reindex(home);
    Ok((old, record))
}

/// Record `model` as agent `selector`'s model handle. The caller checks
/// the handle's form (`model::factory::parse_handle`). Returns the old
/// handle and the updated record.
pub fn set_model(
    home: &Home,
    selector: &str,
    model: &str,
) -> Result<(String, AgentRecord), StoreError> {
    let (mut record, paths) = find(home, Some(selector))?;
    let old = std::mem::replace(&mut record.model, model.to_string());
    if old != record.model {
        record.model_source = Some(ModelSource::SetModel);
        save(&paths, &record)?;
    }
    Ok((old, record))
}

fn build_agent_dir(paths: &AgentPaths, record: &AgentRecord) -> Result<(), StoreError> {
    fs::create_dir_all(paths.dir()).map_err(io(paths.dir()))?;
    // Private from the start: until its first confined run makes it
    // `root:<agent gid>` 0750, no other user (or agent) may enter.
    fs::set_permissions(
        paths.dir(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .map_err(io(paths.dir()))?;
    let files = initial_files();
    let seed: Vec<(&str, &str)> = files.iter().map(|(p, c)| (*p, c.as_str())).collect();
    let sig = agent_signature(record)?;
    repo::create(
        &paths.memory_dir(),
        &paths.memory_git_dir(),
        &seed,
        &sig,
        INITIAL_COMMIT_MESSAGE,
    )?;
    // The layout is memfs-v2 for the repository's whole life, and a person's
    // `git commit` in `memory/` must pass the same validator as ours. The
    // hook only names the mini-letta binary; other programs linking the
    // library leave it to the first CLI write to install.
    let git_dir = paths.memory_git_dir();
    hook::write_layout_policy(&git_dir, Policy::RootMarker)?;
    if let Some(bin) = hook::self_binary() {
        hook::install(&git_dir, &bin)?;
    }
    write_record(&paths.agent_json(), record)
}

/// Rewrite an existing agent's record (atomically).
pub fn save(paths: &AgentPaths, record: &AgentRecord) -> Result<(), StoreError> {
    write_record(&paths.agent_json(), record)
}

fn write_record(path: &std::path::Path, record: &AgentRecord) -> Result<(), StoreError> {
    let mut json = serde_json::to_vec_pretty(record).map_err(|source| StoreError::BadRecord {
        path: path.to_path_buf(),
        source,
    })?;
    json.push(b'\n');
    atomic_write(path, &json).map_err(io(path))
}

/// Remove agent `id` from disk: its directory first (what matters), then
/// everything else that belongs to it — its reflections' directory
/// (`agents/<id>~reflection/`), what a create, import or clone of it left
/// half-way, and the operator's line-editing history of chats with it.
/// Its worktrees, payloads and worker queue live in its directory. The
/// caller has checked nothing of the agent runs and removed its volume.
/// Returns what was removed.
pub fn remove_agent_files(home: &Home, id: &str) -> Result<Vec<PathBuf>, StoreError> {
    let paths = home.agent(id)?;
    let mut removed = Vec::new();
    remove_path(paths.dir(), &mut removed)?;
    let agents = home.agents_dir();
    let entries = fs::read_dir(&agents).map_err(io(&agents))?;
    for entry in entries {
        let entry = entry.map_err(io(&agents))?;
        let name = entry.file_name();
        if name
            .to_str()
            .is_some_and(|n| crate::paths::is_agent_sibling(n, id))
        {
            remove_path(&entry.path(), &mut removed)?;
        }
    }
    remove_path(&home.chat_history_file(id)?, &mut removed)?;
    Ok(removed)
}

/// Remove `path` (a directory with what it holds, or a file; a symlink
/// itself, never what it names); a missing one is fine.
fn remove_path(path: &std::path::Path, removed: &mut Vec<PathBuf>) -> Result<(), StoreError> {
    let gone = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
    };
    gone.map_err(io(path))?;
    removed.push(path.to_path_buf());
    Ok(())
}

/// Rebuild the name index from the records (after a create, rename,
/// import or delete; a failure only costs the next lookup a scan).
pub fn reindex(home: &Home) {
    match list_all(home) {
        Ok(listing) => index::write(home, &listing.entries()),
        Err(e) => tracing::debug!("cannot rebuild the agents' index: {e}"),
    }
}

/// An agent directory whose record cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UnreadableAgent {
    pub id: String,
    /// The name the index last knew for it, if any.
    pub name: Option<String>,
    /// Why it cannot be read.
    #[serde(rename = "error")]
    pub reason: String,
}

/// Every agent directory of a home: the records read (oldest first, ties
/// by name) and the directories whose record could not be read (by id).
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub agents: Vec<AgentRecord>,
    pub unreadable: Vec<UnreadableAgent>,
}

impl Listing {
    /// The index's entries: the records, then the unreadable agents with
    /// the names last known for them.
    pub fn entries(&self) -> Vec<index::Entry> {
        let readable = self.agents.iter().map(|r| index::Entry {
            id: r.id.clone(),
            name: r.name.clone(),
        });
        let unreadable = self.unreadable.iter().map(|u| index::Entry {
            id: u.id.clone(),
            name: u.name.clone().unwrap_or_default(),
        });
        readable.chain(unreadable).collect()
    }

    /// Whether an agent other than `except` (an id) has the name `name`.
    pub fn name_taken(&self, name: &str, except: Option<&str>) -> bool {
        let other = |id: &str| except != Some(id);
        self.agents.iter().any(|a| a.name == name && other(&a.id))
            || self
                .unreadable
                .iter()
                .any(|u| u.name.as_deref() == Some(name) && other(&u.id))
    }

    /// Whether an agent directory (readable or not) has the id `id`.
    pub fn has_id(&self, id: &str) -> bool {
        self.agents.iter().any(|a| a.id == id) || self.unreadable.iter().any(|u| u.id == id)
    }
}

/// Every readable agent, oldest first (ties by name). Agents whose record
/// cannot be read are left out; [`list_all`] reports them.
pub fn list(home: &Home) -> Result<Vec<AgentRecord>, StoreError> {
    Ok(list_all(home)?.agents)
}

/// Every agent directory, its record read or the reason it cannot be.
pub fn list_all(home: &Home) -> Result<Listing, StoreError> {
    let dir = home.agents_dir();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Listing::default()),
        Err(e) => return Err(io(&dir)(e)),
    };
    let mut out = Listing::default();
    let mut known: Option<Vec<index::Entry>> = None;
    for entry in entries {
        let entry = entry.map_err(io(&dir))?;
        let name = entry.file_name();
        let Some(id) = name.to_str() else { continue };
        // Staging directories, the index, lock files, stray files.
        if !index::is_agent_dir(home, id) {
            continue;
        }
        let paths = home.agent(id)?;
        match load_checked(&paths, id) {
            Ok(record) => out.agents.push(record),
            Err(e) => {
                let known = known.get_or_insert_with(|| index::read_any(home));
                let name = known
                    .iter()
                    .find(|k| k.id == id && !k.name.is_empty())
                    .map(|k| k.name.clone());
                out.unreadable.push(UnreadableAgent {
                    id: id.to_string(),
                    name,
                    reason: e.to_string(),
                });
            }
        }
    }
    out.agents.sort_by(|a, b| {
        a.created_at
            .cmp(&b.created_at)
            .then_with(|| a.name.cmp(&b.name))
    });
    out.unreadable.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// The sandbox uids this home's agent records name.
pub fn sandbox_uids(home: &Home) -> Result<Vec<u32>, StoreError> {
    Ok(list(home)?.iter().filter_map(|a| a.sandbox_uid).collect())
}

/// The agent's sandbox uid: the one its record names, else the lowest uid
/// free on this host ([`crate::sandbox::identity::allocate_uid`]), saved in
/// the record before it is used.
pub fn ensure_sandbox_uid(
    home: &Home,
    record: &mut AgentRecord,
    paths: &AgentPaths,
) -> Result<u32, StoreError> {
    if let Some(uid) = record.sandbox_uid {
        return Ok(uid);
    }
    let recorded = sandbox_uids(home)?;
    // The registry hands one agent one uid however many launches ask at
    // once; the record is re-read so a concurrent writer's uid is kept.
    let uid = crate::sandbox::identity::allocate_uid(home, &record.id, &recorded)?;
    let mut fresh = load(paths)?;
    match fresh.sandbox_uid {
        Some(u) => record.sandbox_uid = Some(u),
        None => {
            fresh.sandbox_uid = Some(uid);
            save(paths, &fresh)?;
            record.sandbox_uid = Some(uid);
        }
    }
    Ok(record.sandbox_uid.unwrap_or(uid))
}

/// Read one agent's record.
pub fn load(paths: &AgentPaths) -> Result<AgentRecord, StoreError> {
    let path = paths.agent_json();
    let bytes = fs::read(&path).map_err(io(&path))?;
    serde_json::from_slice(&bytes).map_err(|source| StoreError::BadRecord { path, source })
}

/// [`load`], and the record must name the directory's own id.
fn load_checked(paths: &AgentPaths, id: &str) -> Result<AgentRecord, StoreError> {
    let record = load(paths)?;
    if record.id != id {
        return Err(StoreError::IdMismatch {
            path: paths.agent_json(),
            expected: id.to_string(),
            found: record.id,
        });
    }
    Ok(record)
}

fn unreadable(agent: &str, e: StoreError) -> StoreError {
    StoreError::Unreadable {
        agent: agent.to_string(),
        reason: e.to_string(),
    }
}

/// Find an agent by id or name; with no selector, the only agent there is.
///
/// An id is read directly; a name goes through the index (one small file
/// and one record). Only when the index is missing or out of date, or
/// misses the name, are all records read (and the index rebuilt). An agent
/// whose directory is there but whose record cannot be read is
/// [`StoreError::Unreadable`], found by its id or the name the index last
/// knew for it.
pub fn find(home: &Home, selector: Option<&str>) -> Result<(AgentRecord, AgentPaths), StoreError> {
    if let Some(sel) = selector
        && index::is_agent_dir(home, sel)
    {
        let paths = home.agent(sel)?;
        return match load_checked(&paths, sel) {
            Ok(record) => Ok((record, paths)),
            Err(e) => Err(unreadable(sel, e)),
        };
    }
    if let Some(entries) = index::read_current(home)
        && let Some(found) = find_indexed(home, &entries, selector)?
    {
        return Ok(found);
    }
    let listing = list_all(home)?;
    index::write(home, &listing.entries());
    let Listing {
        mut agents,
        mut unreadable,
    } = listing;
    let found = match selector {
        Some(sel) => {
            if let Some(i) = agents.iter().position(|a| a.id == sel || a.name == sel) {
                agents.swap_remove(i)
            } else if let Some(u) = unreadable
                .iter()
                .find(|u| u.id == sel || u.name.as_deref() == Some(sel))
            {
                return Err(StoreError::Unreadable {
                    agent: sel.to_string(),
                    reason: u.reason.clone(),
                });
            } else {
                return Err(StoreError::NotFound(sel.to_string()));
            }
        }
        None => match (agents.len(), unreadable.len()) {
            (0, 0) => return Err(StoreError::NoAgents),
            (1, 0) => only_one(agents, |a| a.name.clone())?,
            (0, 1) => {
                let u = unreadable.remove(0);
                return Err(StoreError::Unreadable {
                    agent: u.name.unwrap_or(u.id),
                    reason: u.reason,
                });
            }
            _ => {
                let names = agents
                    .iter()
                    .map(|a| a.name.clone())
                    .chain(unreadable.into_iter().map(|u| u.name.unwrap_or(u.id)))
                    .collect::<Vec<_>>();
                return Err(StoreError::Ambiguous(names.join(", ")));
            }
        },
    };
    let paths = home.agent(&found.id)?;
    Ok((found, paths))
}

/// The lookup through a current index; `None` when the index cannot
/// answer (the name is not there, or a record disagrees with it).
fn find_indexed(
    home: &Home,
    entries: &[index::Entry],
    selector: Option<&str>,
) -> Result<Option<(AgentRecord, AgentPaths)>, StoreError> {
    let entry = match selector {
        Some(sel) => match entries.iter().find(|e| !e.name.is_empty() && e.name == sel) {
            Some(e) => e.clone(),
            None => return Ok(None),
        },
        None => only_one(entries.to_vec(), |e| {
            if e.name.is_empty() {
                e.id.clone()
            } else {
                e.name.clone()
            }
        })?,
    };
    let paths = home.agent(&entry.id)?;
    let record = match load_checked(&paths, &entry.id) {
        Ok(r) => r,
        Err(e) => {
            let shown = selector.map_or_else(
                || {
                    if entry.name.is_empty() {
                        entry.id.clone()
                    } else {
                        entry.name.clone()
                    }
                },
                str::to_string,
            );
            return Err(unreadable(&shown, e));
        }
    };
    let agrees = selector.is_none_or(|s| record.name == s);
    Ok(agrees.then_some((record, paths)))
}

/// The single item, or why there is not exactly one.
fn only_one<T>(mut items: Vec<T>, name: impl Fn(&T) -> String) -> Result<T, StoreError> {
    match items.len() {
        0 => Err(StoreError::NoAgents),
        1 => items.pop().ok_or(StoreError::NoAgents),
        _ => Err(StoreError::Ambiguous(
            items.iter().map(name).collect::<Vec<_>>().join(", "),
        )),
    }
}
