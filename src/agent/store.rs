//! Creating, listing and finding agents under a home directory.

use std::fs;
use std::path::PathBuf;

use git2::Signature;
use rand::RngCore;
use time::OffsetDateTime;

use super::index;
use super::record::{AgentRecord, DEFAULT_MODEL, DEFAULT_SYSTEM_PROMPT};
use crate::fsutil::atomic_write;
use crate::memfs::compiler::iso_timestamp;
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
    #[error("no agent {0:?} (see `mini-letta agent list`)")]
    NotFound(String),
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
pub fn new_agent_id() -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "agent-{}-{}-{}-{}-{}",
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

/// Create an agent: its directory, `agent.json`, and a memory repository with
/// one initial commit. The directory is built under a temporary name and
/// renamed into place, so a crash never leaves a half-made agent behind.
pub fn create(home: &Home, name: &str, system: Option<String>) -> Result<AgentRecord, StoreError> {
    create_with_quota(home, name, system, None)
}

/// [`create`], the agent's directory on a volume of its own when `quota`
/// is given (see `sandbox::volume`).
pub fn create_with_quota(
    home: &Home,
    name: &str,
    system: Option<String>,
    quota: Option<crate::sandbox::volume::Quota>,
) -> Result<AgentRecord, StoreError> {
    if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(StoreError::InvalidName);
    }
    if list(home)?.iter().any(|a| a.name == name) {
        return Err(StoreError::NameTaken(name.to_string()));
    }
    let agents = home.agents_dir();
    fs::create_dir_all(&agents).map_err(io(&agents))?;

    let record = AgentRecord {
        id: new_agent_id(),
        name: name.to_string(),
        description: None,
        system: system.unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string()),
        tags: Vec::new(),
        model: DEFAULT_MODEL.to_string(),
        model_settings: serde_json::Map::new(),
        created_at: iso_timestamp(OffsetDateTime::now_utc()),
        sandbox_uid: None,
        quota,
    };
    let final_paths = home.agent(&record.id)?;
    let staging = home.agent_staging(&record.id)?;
    match build_agent_dir(&staging, &record) {
        Ok(()) => {
            match quota {
                None => {
                    fs::rename(staging.dir(), final_paths.dir()).map_err(io(final_paths.dir()))?
                }
                Some(q) => {
                    let made = crate::sandbox::volume::create(
                        home,
                        &record.id,
                        staging.dir(),
                        final_paths.dir(),
                        q,
                    );
                    let _ = fs::remove_dir_all(staging.dir());
                    made?;
                }
            }
            reindex(home);
            Ok(record)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(staging.dir());
            Err(e)
        }
    }
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

/// Rebuild the name index from the records (after a create or delete; a
/// failure only costs the next lookup a scan).
pub fn reindex(home: &Home) {
    match list(home) {
        Ok(agents) => index::write(home, &agents),
        Err(e) => tracing::debug!("cannot rebuild the agents' index: {e}"),
    }
}

/// Every agent, oldest first (ties by name).
pub fn list(home: &Home) -> Result<Vec<AgentRecord>, StoreError> {
    let dir = home.agents_dir();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(&dir)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(&dir))?;
        let name = entry.file_name();
        let Some(id) = name.to_str() else { continue };
        let Ok(paths) = home.agent(id) else { continue }; // staging dirs, stray files
        if paths.agent_json().is_file() {
            out.push(load(&paths)?);
        }
    }
    out.sort_by(|a, b| {
        a.created_at
            .cmp(&b.created_at)
            .then_with(|| a.name.cmp(&b.name))
    });
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

/// Find an agent by id or name; with no selector, the only agent there is.
///
/// An id is read directly; a name goes through the index (one small file
/// and one record). Only when the index is missing or out of date, or
/// misses the name, are all records read (and the index rebuilt).
pub fn find(home: &Home, selector: Option<&str>) -> Result<(AgentRecord, AgentPaths), StoreError> {
    if let Some(sel) = selector
        && let Ok(paths) = home.agent(sel)
        && paths.agent_json().is_file()
    {
        let record = load(&paths)?;
        if record.id == sel {
            return Ok((record, paths));
        }
    }
    if let Some(entries) = index::read_current(home)
        && let Some(found) = find_indexed(home, &entries, selector)?
    {
        return Ok(found);
    }
    let agents = list(home)?;
    index::write(home, &agents);
    let found = match selector {
        Some(sel) => agents
            .into_iter()
            .find(|a| a.id == sel || a.name == sel)
            .ok_or_else(|| StoreError::NotFound(sel.to_string()))?,
        None => only_one(agents, |a| a.name.clone())?,
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
        Some(sel) => match entries.iter().find(|e| e.name == sel) {
            Some(e) => e.clone(),
            None => return Ok(None),
        },
        None => only_one(entries.to_vec(), |e| e.name.clone())?,
    };
    let paths = home.agent(&entry.id)?;
    let record = load(&paths)?;
    let agrees = record.id == entry.id && selector.is_none_or(|s| record.name == s);
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
