//! Agents on a shared remote (`MINI_LETTA_REMOTE_ROOT`): the record travels
//! with the memory, and a host that has never seen an agent clones it.
//!
//! A remote agent is the repository `<root>/<id>.git`. Its `main` is the
//! memory; [`RECORD_REF`] is a chain of commits whose tree holds one file,
//! `agent.json`: the portable part of the record (name, system prompt,
//! model, settings). What belongs to one host — the sandbox uid, the quota —
//! never travels, and a record read from a remote is checked like any input
//! (its id must be the repository's, its name and model well-formed).
//!
//! Listing and finding by name need to enumerate repositories, which git can
//! only do for a directory of bare repositories; on a URL remote an agent is
//! named by its id. Network git runs through [`crate::memfs::gitcli`]. A
//! directory remote's repository is checked before it is read or fetched
//! ([`crate::memfs::remote_repo`]), and a clone's memory is validated
//! before it is checked out.

use std::fs;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};
use serde::Serialize;

use crate::memfs::gitcli::{self, GitCliError};
use crate::memfs::repo::{self, MAIN_BRANCH, RepoError};
use crate::memfs::sync::{
    self, REMOTE_ROOT_ENV, REMOTE_TRACKING_REF, RemoteRoot, SyncError, SyncOutcome,
};
use crate::memfs::worktree::WorktreeError;
use crate::paths::{AgentPaths, CLONE_STAGING_PREFIX, Home, PathsError, is_valid_agent_id};
use crate::store::record::AgentRecord;
use crate::store::{self, StoreError};

/// The ref holding the agent's portable record, locally and on the remote.
pub const RECORD_REF: &str = "refs/mini-letta/agent";

/// The record file inside a [`RECORD_REF`] commit.
const RECORD_FILE: &str = "agent.json";

/// A record is a few kilobytes; anything far larger is not one.
const MAX_RECORD_BYTES: usize = 256 * 1024;

/// An agent found on the remote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RemoteAgent {
    pub id: String,
    /// `None` when the repository carries no (readable) record.
    pub name: Option<String>,
    pub model: Option<String>,
    pub created_at: Option<String>,
    /// Why the record could not be used, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("no remote configured: set {REMOTE_ROOT_ENV}")]
    NoRemote,
    #[error("no agent {selector:?} on the remote {root}")]
    NotFound { selector: String, root: String },
    #[error("several agents on the remote {root} are named {name:?} ({ids}); name one by its id")]
    Ambiguous {
        name: String,
        root: String,
        ids: String,
    },
    #[error(
        "the remote {root} is a git URL: git cannot list a server's repositories, so agents \
there are named by id (agent-…), not by name"
    )]
    UrlByName { root: String },
    #[error("the remote agent {id} has no memory yet (no {MAIN_BRANCH} branch)")]
    Empty { id: String },
    #[error("the remote record of agent {id} is unusable: {reason}")]
    BadRecord { id: String, reason: String },
    #[error("an agent named {name:?} already exists here ({local}); rename it before cloning {id}")]
    NameTaken {
        name: String,
        local: String,
        id: String,
    },
    #[error("agent {0} is already here")]
    AlreadyHere(String),
    #[error("the remote memory of {id} is not valid: {reason}")]
    InvalidMemory { id: String, reason: String },
    #[error("cannot {what}: {source}")]
    Git {
        what: &'static str,
        source: git2::Error,
    },
    #[error(transparent)]
    Cli(#[from] GitCliError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Paths(#[from] PathsError),
    #[error(transparent)]
    Sync(#[from] SyncError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn git(what: &'static str) -> impl FnOnce(git2::Error) -> RemoteError {
    move |source| RemoteError::Git { what, source }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RemoteError + '_ {
    move |source| RemoteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The remote root from the environment, if set and not blank.
pub fn root_from_env() -> Option<String> {
    std::env::var(REMOTE_ROOT_ENV)
        .ok()
        .filter(|r| !r.trim().is_empty())
}

/// The record as it travels: without what belongs to one host.
fn portable(record: &AgentRecord) -> AgentRecord {
    AgentRecord {
        sandbox_uid: None,
        quota: None,
        ..record.clone()
    }
}

fn record_bytes(record: &AgentRecord) -> Vec<u8> {
    let mut json = serde_json::to_vec_pretty(&portable(record)).unwrap_or_default();
    json.push(b'\n');
    json
}

/// Read and check the record a [`RECORD_REF`] commit holds, for the
/// repository of agent `id`.
fn record_at(repo: &Repository, id: &str, commit: Oid) -> Result<AgentRecord, String> {
    let tree = repo
        .find_commit(commit)
        .and_then(|c| c.tree())
        .map_err(|e| e.message().to_string())?;
    let entry = tree
        .get_name(RECORD_FILE)
        .ok_or_else(|| format!("no {RECORD_FILE} in the record commit"))?;
    let blob = repo
        .find_blob(entry.id())
        .map_err(|e| e.message().to_string())?;
    if blob.size() > MAX_RECORD_BYTES {
        return Err(format!(
            "{RECORD_FILE} is {} bytes (at most {MAX_RECORD_BYTES})",
            blob.size()
        ));
    }
    let record: AgentRecord = serde_json::from_slice(blob.content()).map_err(|e| e.to_string())?;
    if record.id != id {
        return Err(format!(
            "it names agent {:?}, not the repository's {id:?}",
            record.id
        ));
    }
    store::check_name(&record.name).map_err(|e| e.to_string())?;
    record.check_untrusted()?;
    crate::model::factory::parse_handle(&record.model).map_err(|e| e.to_string())?;
    Ok(portable(&record))
}

/// The agents in a directory remote root, sorted by id, as seen from the
/// home `home`. A URL root cannot be listed ([`RemoteError::UrlByName`]).
pub fn list(home: &Home, root: &str) -> Result<Vec<RemoteAgent>, RemoteError> {
    let RemoteRoot::Dir(root_dir) = RemoteRoot::parse(root).map_err(SyncError::from)? else {
        return Err(RemoteError::UrlByName {
            root: root.to_string(),
        });
    };
    let mut out = Vec::new();
    for id in sync::remote_agents(root) {
        let bare = crate::paths::remote_agent_repo(&root_dir, &id)?;
        let found = crate::memfs::remote_repo::check(&root_dir, &bare, home.root())
            .map_err(|e| e.to_string())
            .and_then(|()| repo::open_bare(&bare).map_err(|e| e.to_string()))
            .and_then(|repo| {
                let tip = repo
                    .refname_to_id(RECORD_REF)
                    .map_err(|_| "no agent record (pushed by an older mini-letta?)".to_string())?;
                record_at(&repo, &id, tip)
            });
        out.push(match found {
            Ok(r) => RemoteAgent {
                id,
                name: Some(r.name),
                model: Some(r.model),
                created_at: Some(r.created_at),
                error: None,
            },
            Err(reason) => RemoteAgent {
                id,
                name: None,
                model: None,
                created_at: None,
                error: Some(reason),
            },
        });
    }
    Ok(out)
}

/// One agent's fence as the remote holds it (issue 43 §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RemoteFence {
    pub agent: String,
    /// The stamp's host, as [`crate::memfs::fence::shown`] shows it.
    pub host: String,
    pub epoch: i64,
    /// Whether the epoch is one mini-letta could have issued
    /// ([`crate::memfs::fence::MAX_EPOCH`]); a planted one is listed, not used.
    pub plausible: bool,
}

/// The largest epoch among `fences` that mini-letta could have issued
/// (0 when there is none): what the cluster's epoch base must pass.
pub fn largest_fence_epoch(fences: &[RemoteFence]) -> i64 {
    fences
        .iter()
        .filter(|f| f.plausible)
        .map(|f| f.epoch)
        .max()
        .unwrap_or(0)
}

/// The fences of the agents under `root`: every agent of a directory root
/// (each repository checked first), or — a network root cannot be listed
/// — this home's agents, as their last sync fetched them.
pub fn fences(home: &Home, root: &str) -> Result<Vec<RemoteFence>, RemoteError> {
    use crate::memfs::fence::{FENCE_REF, FENCE_TRACKING_REF, shown, stamp_of};
    let found = |agent: &str, repo: &Repository, name: &str| {
        let id = repo.refname_to_id(name).ok()?;
        let stamp = stamp_of(repo, id)?;
        Some(RemoteFence {
            agent: agent.to_string(),
            host: shown(&stamp.host),
            epoch: stamp.epoch,
            plausible: (0..=crate::memfs::fence::MAX_EPOCH).contains(&stamp.epoch),
        })
    };
    let mut out = Vec::new();
    match RemoteRoot::parse(root).map_err(SyncError::from)? {
        RemoteRoot::Dir(_) => {
            for id in sync::remote_agents(root) {
                let Ok(url) = sync::agent_url(root, &id, home.root()) else {
                    continue;
                };
                if let Ok(repo) = repo::open_bare(Path::new(&url)) {
                    out.extend(found(&id, &repo, FENCE_REF));
                }
            }
        }
        RemoteRoot::Network(_) => {
            for record in store::list(home).unwrap_or_default() {
                let paths = home.agent(&record.id)?;
                if let Ok(repo) = repo::open_bare(&paths.memory_git_dir()) {
                    out.extend(found(&record.id, &repo, FENCE_TRACKING_REF));
                }
            }
        }
    }
    Ok(out)
}

/// The id of the remote agent `selector` names (an id, or a name on a
/// directory root listed from `home`).
pub fn locate(home: &Home, root: &str, selector: &str) -> Result<String, RemoteError> {
    let not_found = || RemoteError::NotFound {
        selector: selector.to_string(),
        root: root.to_string(),
    };
    if let RemoteRoot::Network(_) = RemoteRoot::parse(root).map_err(SyncError::from)? {
        if !is_valid_agent_id(selector) {
            return Err(RemoteError::UrlByName {
                root: root.to_string(),
            });
        }
        let url = sync::agent_url(root, selector, home.root())?;
        let spec = format!("refs/heads/{MAIN_BRANCH}");
        let listed = gitcli::run(None, &["ls-remote", "--", &url, &spec])?;
        // An absent repository is "not found"; only a reachable one with
        // no main is empty.
        if !listed.ok {
            return Err(not_found());
        }
        if listed.stdout.trim().is_empty() {
            return Err(RemoteError::Empty {
                id: selector.to_string(),
            });
        }
        return Ok(selector.to_string());
    }
    let agents = list(home, root)?;
    if let Some(a) = agents.iter().find(|a| a.id == selector) {
        return Ok(a.id.clone());
    }
    let named: Vec<&RemoteAgent> = agents
        .iter()
        .filter(|a| a.name.as_deref() == Some(selector))
        .collect();
    match named.as_slice() {
        [] => Err(not_found()),
        [one] => Ok(one.id.clone()),
        many => Err(RemoteError::Ambiguous {
            name: selector.to_string(),
            root: root.to_string(),
            ids: many
                .iter()
                .map(|a| a.id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Which refs the remote at `url` has among `names`.
fn remote_has(git_dir: &Path, url: &str, names: &[&str]) -> Result<Vec<bool>, RemoteError> {
    let mut args = vec!["ls-remote", "--", url];
    args.extend_from_slice(names);
    let listed = gitcli::run(Some(git_dir), &args)?.checked("ls-remote")?;
    Ok(names
        .iter()
        .map(|n| {
            listed
                .stdout
                .lines()
                .any(|l| l.split('\t').nth(1) == Some(*n))
        })
        .collect())
}

/// Clone the remote agent `selector` into this home: its memory (full
/// history, checked out, validated) and its record. Built in a staging
/// directory and renamed into place, so a failure leaves nothing behind.
pub fn clone(home: &Home, root: &str, selector: &str) -> Result<AgentRecord, RemoteError> {
    let id = locate(home, root, selector)?;
    if home.agent(&id)?.dir().exists() {
        return Err(RemoteError::AlreadyHere(id));
    }
    let url = sync::agent_url(root, &id, home.root())?;
    let agents = home.agents_dir();
    fs::create_dir_all(&agents).map_err(io(&agents))?;
    let staging = tempfile::Builder::new()
        .prefix(&format!("{CLONE_STAGING_PREFIX}{id}-"))
        .tempdir_in(&agents)
        .map_err(io(&agents))?;
    let paths = AgentPaths::from_dir(staging.path());
    let git_dir = paths.memory_git_dir();
    let repo = repo::init_linked(&paths.memory_dir(), &git_dir)?;

    let main = format!("refs/heads/{MAIN_BRANCH}");
    let has = remote_has(&git_dir, &url, &[&main, RECORD_REF])?;
    if !has[0] {
        return Err(RemoteError::Empty { id });
    }
    let mut specs = vec![format!("+{main}:{REMOTE_TRACKING_REF}")];
    if has[1] {
        specs.push(format!("+{RECORD_REF}:{RECORD_REF}"));
    }
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    gitcli::fetch(&git_dir, &url, &specs)?.checked("fetch")?;

    let tip = repo
        .refname_to_id(REMOTE_TRACKING_REF)
        .map_err(git("read the fetched main"))?;
    // Judged before anything is checked out: a hostile tree never reaches
    // the disk (the staging directory goes with the error).
    if let Some(reason) = sync::accept_from_remote(&repo, tip, None)? {
        return Err(RemoteError::InvalidMemory { id, reason });
    }
    repo.reference(&main, tip, true, "mini-letta: cloned from the remote")
        .map_err(git("set main"))?;
    let mut checkout = git2::build::CheckoutBuilder::new();
    checkout.force();
    repo.checkout_head(Some(&mut checkout))
        .map_err(git("check out the memory"))?;

    let mut record = if has[1] {
        let at = repo
            .refname_to_id(RECORD_REF)
            .map_err(git("read the agent record"))?;
        record_at(&repo, &id, at).map_err(|reason| RemoteError::BadRecord {
            id: id.clone(),
            reason,
        })?
    } else {
        // A repository pushed without a record: the agent keeps its id as
        // its name and the defaults, which `agent rename` can change.
        synthesized_record(&id)
    };
    record.sandbox_uid = None;
    record.quota = None;
    drop(repo);

    crate::store::archive::finish_repository(&paths, None).map_err(|e| {
        RemoteError::InvalidMemory {
            id: id.clone(),
            reason: e.to_string(),
        }
    })?;
    store::save(&paths, &record)?;
    fs::set_permissions(
        staging.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .map_err(io(staging.path()))?;

    let _names = store::lock_names(home)?;
    let listing = store::list_all(home)?;
    if listing.has_id(&id) {
        return Err(RemoteError::AlreadyHere(id));
    }
    if let Some(other) = listing.agents.iter().find(|a| a.name == record.name) {
        return Err(RemoteError::NameTaken {
            name: record.name.clone(),
            local: other.id.clone(),
            id,
        });
    }
    let staged = staging.keep();
    store::place_agent_dir(home, &record, &staged)?;
    store::reindex(home);
    Ok(record)
}

fn synthesized_record(id: &str) -> AgentRecord {
    AgentRecord {
        id: id.to_string(),
        name: id.to_string(),
        description: None,
        system: crate::store::record::DEFAULT_SYSTEM_PROMPT.to_string(),
        tags: Vec::new(),
        model: crate::store::record::DEFAULT_MODEL.to_string(),
        model_settings: serde_json::Map::new(),
        created_at: crate::clock::js_iso(crate::clock::now()),
        sandbox_uid: None,
        quota: None,
        compaction_settings: None,
        model_source: None,
    }
}

/// Publish `record` to the agent's remote at `url` when it differs from the
/// last one published from here: a new commit on [`RECORD_REF`] over the
/// remote's, pushed without force (a record another host pushed meanwhile
/// is fetched and built upon, once). Whether anything was pushed.
pub fn publish(agent: &AgentPaths, record: &AgentRecord, url: &str) -> Result<bool, RemoteError> {
    let git_dir = agent.memory_git_dir();
    let repo = repo::open_agent(agent)?;
    let json = record_bytes(record);
    let current = |repo: &Repository, tip: Oid| -> bool {
        record_at(repo, &record.id, tip)
            .map(|r| record_bytes(&r) == json)
            .unwrap_or(false)
    };
    if let Ok(tip) = repo.refname_to_id(RECORD_REF)
        && current(&repo, tip)
    {
        return Ok(false);
    }
    let tracking = "refs/remotes/origin/mini-letta-agent";
    // A push refused because another host published meanwhile: built again
    // on the record it published, once.
    let rejected = |e: &RemoteError| matches!(e, RemoteError::Cli(c) if c.command == "push");
    crate::retry::Policy::immediate(2).run(rejected, || {
        let parent = if remote_has(&git_dir, url, &[RECORD_REF])?[0] {
            let spec = format!("+{RECORD_REF}:{tracking}");
            gitcli::fetch(&git_dir, url, &[&spec])?.checked("fetch")?;
            Some(
                repo.refname_to_id(tracking)
                    .map_err(git("read the remote record"))?,
            )
        } else {
            None
        };
        if let Some(p) = parent
            && current(&repo, p)
        {
            repo.reference(RECORD_REF, p, true, "mini-letta: record as on the remote")
                .map_err(git("set the record ref"))?;
            return Ok(false);
        }
        let blob = repo.blob(&json).map_err(git("write the record"))?;
        let mut tb = repo.treebuilder(None).map_err(git("write the record"))?;
        tb.insert(RECORD_FILE, blob, 0o100644)
            .map_err(git("write the record"))?;
        let tree = repo
            .find_tree(tb.write().map_err(git("write the record"))?)
            .map_err(git("write the record"))?;
        let sig = git2::Signature::now("mini-letta", "mini-letta@localhost")
            .map_err(git("sign the record"))?;
        let parents: Vec<git2::Commit> = parent
            .map(|p| repo.find_commit(p))
            .transpose()
            .map_err(git("read the remote record"))?
            .into_iter()
            .collect();
        let parent_refs: Vec<&git2::Commit> = parents.iter().collect();
        let commit = repo
            .commit(None, &sig, &sig, "agent record", &tree, &parent_refs)
            .map_err(git("write the record"))?;
        // The local ref says what was last published: it moves only once
        // the remote took the commit (a refused push set it before, and the
        // record was never offered again).
        let spec = format!("{commit}:{RECORD_REF}");
        let pushed = gitcli::run(Some(&git_dir), &["push", "--porcelain", "--", url, &spec])?;
        if !pushed.ok {
            return Err(GitCliError {
                command: "push".into(),
                message: pushed.stderr.trim().to_string(),
            }
            .into());
        }
        repo.reference(RECORD_REF, commit, true, "mini-letta: publish the record")
            .map_err(git("set the record ref"))?;
        Ok(true)
    })
}

/// [`sync::sync`] of an agent's memory, then its record published when the
/// memory reached the remote. A record that cannot be published is noted
/// in the message; the memory's status stands.
pub(crate) fn sync_agent(
    agent: &AgentPaths,
    record: &AgentRecord,
    root: Option<&str>,
) -> Result<SyncOutcome, SyncError> {
    sync_agent_fenced(agent, record, root, None)
}

/// [`sync_agent`], fenced in a cluster ([`sync::sync_fenced`]).
pub(crate) fn sync_agent_fenced(
    agent: &AgentPaths,
    record: &AgentRecord,
    root: Option<&str>,
    fence: Option<&dyn crate::memfs::fence::Fence>,
) -> Result<SyncOutcome, SyncError> {
    let committer = store::commit_signature(agent).map_err(|source| WorktreeError::Git {
        what: "make a commit signature",
        source,
    })?;
    let mut outcome = match fence {
        Some(f) => sync::sync_fenced(agent, &record.id, root, &committer, f)?,
        None => sync::sync(agent, &record.id, root, &committer)?,
    };
    let reached = matches!(
        outcome.status,
        sync::SyncStatus::Pushed | sync::SyncStatus::Clean
    );
    if let (true, Some(root)) = (reached, root) {
        let home = agent
            .home()
            .map(|h| h.root().to_path_buf())
            .unwrap_or_else(|| agent.dir().to_path_buf());
        let published = sync::agent_url(root, &record.id, &home)
            .map_err(RemoteError::from)
            .and_then(|url| publish(agent, record, &url));
        if let Err(e) = published {
            tracing::warn!("agent {}: the record was not published: {e}", record.id);
            outcome
                .message
                .push_str(&format!(" (the agent record was not published: {e})"));
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn synced_agent(root: &str) -> (tempfile::TempDir, AgentRecord) {
        let home_dir = tempfile::tempdir().unwrap();
        let home = Home::at(home_dir.path());
        let mut record = store::create(&home, "traveller", None).unwrap();
        // Host-local fields: never published.
        record.sandbox_uid = Some(4242);
        let paths = home.agent(&record.id).unwrap();
        store::save(&paths, &record).unwrap();
        let out = sync_agent(&paths, &record, Some(root)).unwrap();
        assert_eq!(out.status, sync::SyncStatus::Pushed, "{out:?}");
        (home_dir, record)
    }

    fn remote_record(root: &str, id: &str) -> serde_json::Value {
        let repo = Repository::open_bare(sync::remote_url(root, id)).unwrap();
        let tip = repo.refname_to_id(RECORD_REF).unwrap();
        let tree = repo.find_commit(tip).unwrap().tree().unwrap();
        let blob = repo
            .find_blob(tree.get_name(RECORD_FILE).unwrap().id())
            .unwrap();
        serde_json::from_slice(blob.content()).unwrap()
    }

    #[test]
    fn the_record_travels_without_host_fields_and_clones_elsewhere() {
        let root = tempfile::tempdir().unwrap();
        let root_s = root.path().to_str().unwrap();
        let (a_home, record) = synced_agent(root_s);
        let v = remote_record(root_s, &record.id);
        assert_eq!(v["name"], "traveller");
        assert!(v.get("sandbox_uid").is_none(), "{v}");
        let listed = list(&Home::at(a_home.path()), root_s).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name.as_deref(), Some("traveller"));

        let b_dir = tempfile::tempdir().unwrap();
        let b = Home::at(b_dir.path());
        let cloned = clone(&b, root_s, "traveller").unwrap();
        assert_eq!(cloned.id, record.id);
        assert_eq!(cloned.sandbox_uid, None);
        let (found, paths) = store::find(&b, Some("traveller")).unwrap();
        assert_eq!(found.id, record.id);
        let human = fs::read_to_string(paths.memory_dir().join("human.md")).unwrap();
        assert!(human.contains("name:"), "{human}");
        // A second clone is refused, not merged over the first.
        assert!(matches!(
            clone(&b, root_s, &record.id),
            Err(RemoteError::AlreadyHere(_))
        ));
        // No staging directory is left behind.
        let leftovers: Vec<_> = fs::read_dir(b.agents_dir())
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(CLONE_STAGING_PREFIX)
            })
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn a_record_naming_another_agent_is_refused_and_leaves_nothing() {
        let root = tempfile::tempdir().unwrap();
        let root_s = root.path().to_str().unwrap();
        let (a_home, record) = synced_agent(root_s);
        // Someone with write access to the remote plants a record that
        // claims another id.
        let repo = Repository::open_bare(sync::remote_url(root_s, &record.id)).unwrap();
        let mut forged = portable(&record);
        forged.id = "agent-someone-else".into();
        let blob = repo.blob(&record_bytes(&forged)).unwrap();
        let mut tb = repo.treebuilder(None).unwrap();
        tb.insert(RECORD_FILE, blob, 0o100644).unwrap();
        let tree = repo.find_tree(tb.write().unwrap()).unwrap();
        let sig = git2::Signature::now("x", "x@x").unwrap();
        let c = repo.commit(None, &sig, &sig, "forged", &tree, &[]).unwrap();
        repo.reference(RECORD_REF, c, true, "forge").unwrap();

        let b_dir = tempfile::tempdir().unwrap();
        let b = Home::at(b_dir.path());
        let e = clone(&b, root_s, &record.id).unwrap_err();
        assert!(matches!(e, RemoteError::BadRecord { .. }), "{e}");
        assert!(!b.agent(&record.id).unwrap().dir().exists());
        assert_eq!(fs::read_dir(b.agents_dir()).unwrap().count(), 0);
        // Listed, but as unreadable, and never found by the forged name.
        let listed = list(&Home::at(a_home.path()), root_s).unwrap();
        assert!(listed[0].error.is_some());
    }

    #[test]
    fn url_roots_are_named_by_id() {
        assert!(matches!(
            list(
                &Home::at(Path::new("/nonexistent")),
                "ssh://git@example.com/memories"
            ),
            Err(RemoteError::UrlByName { .. })
        ));
        assert!(matches!(
            locate(
                &Home::at(Path::new("/nonexistent")),
                "https://example.com/m",
                "some name"
            ),
            Err(RemoteError::UrlByName { .. })
        ));
    }

    /// A synced agent under remote root `root`: its home (kept alive by
    /// the caller), record, paths and remote URL.
    fn published_agent(root: &str) -> (tempfile::TempDir, AgentRecord, AgentPaths, String) {
        let (a, record) = synced_agent(root);
        let paths = Home::at(a.path()).agent(&record.id).unwrap();
        let url = sync::agent_url(root, &record.id, a.path()).unwrap();
        (a, record, paths, url)
    }

    #[test]
    fn an_unchanged_record_is_not_pushed_again() {
        let root = tempfile::tempdir().unwrap();
        let root_s = root.path().to_str().unwrap();
        let (_a, record, paths, url) = published_agent(root_s);
        assert!(!publish(&paths, &record, &url).unwrap());
        let renamed = AgentRecord {
            name: "wanderer".into(),
            ..record.clone()
        };
        assert!(publish(&paths, &renamed, &url).unwrap());
        assert_eq!(remote_record(root_s, &record.id)["name"], "wanderer");
    }

    /// A push the remote refuses (here: its record ref is locked, as by
    /// another host's push under way) ends with the push's own error, the
    /// remote's record as it was — and the next publish offers the record
    /// again (the local ref used to move before the push, so a refused
    /// record counted as published and was never pushed).
    #[test]
    fn a_refused_record_push_is_the_push_error() {
        let root = tempfile::tempdir().unwrap();
        let root_s = root.path().to_str().unwrap();
        let (_a, record, paths, url) = published_agent(root_s);
        let renamed = AgentRecord {
            name: "wanderer".into(),
            ..record.clone()
        };
        assert!(publish(&paths, &renamed, &url).unwrap());
        let lock = std::path::Path::new(&url).join(format!("{RECORD_REF}.lock"));
        std::fs::write(&lock, "").unwrap();
        let again = AgentRecord {
            name: "rover".into(),
            ..record.clone()
        };
        let err = publish(&paths, &again, &url).unwrap_err();
        assert!(
            matches!(&err, RemoteError::Cli(c) if c.command == "push"),
            "{err}"
        );
        std::fs::remove_file(&lock).unwrap();
        assert_eq!(remote_record(root_s, &record.id)["name"], "wanderer");
        assert!(publish(&paths, &again, &url).unwrap());
        assert_eq!(remote_record(root_s, &record.id)["name"], "rover");
    }
}
