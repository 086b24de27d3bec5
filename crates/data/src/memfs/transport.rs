//! How sync reaches a remote: a fetch of named refs into tracking refs, and
//! a push of ref updates that succeeds only when every ref is still what
//! was fetched (compare-and-swap) and moves forward.
//!
//! A *directory* remote is reached in-process with git2: no process starts
//! (a `git fetch` + `git push` pair costs six: two gits, the shell and the
//! `upload-pack`/`receive-pack` each runs), objects are copied straight from
//! one object database to the other — loose for a small change, as one
//! pack for a large one — and the remote's refs are updated under its own
//! ref locks, the ones `git receive-pack` takes, so a git pushing there at
//! the same time waits or fails rather than being overwritten. Nothing of
//! the remote runs: no hook, no configuration of its is obeyed beyond
//! libgit2's reading. The repository is opened sealed (`repo::open_bare`),
//! after `remote_repo::check` (the caller's `sync::agent_url`).
//!
//! A *URL* remote goes through the git CLI (`gitcli`), so the operator's
//! credential helpers and ssh configuration apply; several updates are one
//! `--atomic` push.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;

use git2::{ObjectType, Odb, Oid, Repository};

use crate::memfs::gitcli::{self, GitCliError};
use crate::memfs::push_claim::{self, ClaimError};
use crate::memfs::repo::{RepoError, open_bare};

/// Objects copied one by one at most; more go as one pack (git's own
/// `transfer.unpackLimit` default).
const LOOSE_LIMIT: usize = 100;

/// A remote ref to fetch: its name there and the tracking ref it lands on.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    pub remote: &'a str,
    pub tracking: &'a str,
}

/// One ref update of a push: `name` from `old` (`None`: absent) to `new`.
#[derive(Debug, Clone, Copy)]
pub struct Update<'a> {
    pub name: &'a str,
    pub old: Option<Oid>,
    pub new: Oid,
}

/// How a push ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    Done,
    /// The caller's last check, made under the remote's locks, said no
    /// (why): nothing was updated.
    Refused(String),
    /// The remote moved meanwhile (or is being written): worth a new fetch.
    Rejected(String),
    /// Anything else (auth, network, a refusing remote): not worth a retry.
    Failed(String),
}

/// Why a fetch or push could not be made (a refusal is [`Pushed`]).
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error("cannot {what}: {source}")]
    Git {
        what: &'static str,
        source: git2::Error,
    },
    #[error(transparent)]
    Command(#[from] GitCliError),
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// An object the remote offers is over what a memory may hold: refused
    /// before anything is copied (issue 43: a 200 MB blob took a syncing
    /// supervisor from 18 to 428 MB).
    #[error("{}", too_large(kind, path, *id, *size, *max))]
    TooLarge {
        kind: &'static str,
        /// Where the first commit that names it has it (blobs and trees).
        path: Option<String>,
        id: Oid,
        size: usize,
        max: usize,
    },
}

/// The largest blob a fetch copies: a memory file over the validator's
/// hard limit could never be accepted anyway.
const MAX_FETCHED_BLOB_BYTES: usize = crate::memfs::validate::MAX_FILE_BYTES as usize;

/// The largest tree or commit a fetch copies (a tree of tens of thousands
/// of entries, a long message).
const MAX_FETCHED_META_BYTES: usize = 4 * 1024 * 1024;

/// The refusal of an oversized object, in the validator's words for a file.
fn too_large(kind: &str, path: &Option<String>, id: Oid, size: usize, max: usize) -> String {
    match path {
        Some(p) if kind == "file" => format!(
            "{p}: {size} bytes exceeds the {max}-byte file limit (refused from its header; nothing was fetched)"
        ),
        Some(p) => format!(
            "{p}: a {kind} of {size} bytes exceeds the {max}-byte limit (refused from its header; nothing was fetched)"
        ),
        None => format!(
            "{kind} {id}: {size} bytes exceeds the {max}-byte limit (refused from its header; nothing was fetched)"
        ),
    }
}

fn git(what: &'static str) -> impl FnOnce(git2::Error) -> TransportError {
    move |source| TransportError::Git { what, source }
}

/// Whether `root` is a git URL (`scheme://…` or scp-like `[user@]host:path`)
/// rather than a local directory.
pub(crate) fn is_url(root: &str) -> bool {
    if root.contains("://") {
        return true;
    }
    // Git's own rule: a colon before the first slash; one letter before it
    // would be a drive letter, not a host.
    match root.split_once(':') {
        Some((host, _)) => !host.contains('/') && host.len() > 1,
        None => false,
    }
}

/// Fetch `wanted` from `url` into their tracking refs. Each tip in the
/// answer is the remote ref's value, `None` when the remote lacks it (its
/// tracking ref is then left as it was).
pub fn fetch(
    repo: &Repository,
    git_dir: &Path,
    url: &str,
    wanted: &[Wanted<'_>],
) -> Result<Vec<Option<Oid>>, TransportError> {
    if is_url(url) {
        fetch_cli(repo, git_dir, url, wanted)
    } else {
        fetch_dir(repo, Path::new(url), wanted)
    }
}

/// A check the caller makes right before a push lands (in a cluster: that
/// etcd still says this host owns the agent); `Err(why)` stops it.
pub type LastCheck<'a> = &'a dyn Fn() -> Result<(), String>;

/// Apply `updates` to `url`. On a directory remote every ref is locked and
/// checked first, then `last_check` runs under those locks, then the
/// updates land in their order — the last one after the others, so a
/// writer killed in between leaves the earlier ones moved and the last
/// not, never the reverse (the fence goes last: a `main` ahead of what the
/// fence records is an interrupted push, one behind it a rollback). On a
/// URL, `last_check` runs before one `--atomic` push. The caller checked
/// that each `new` descends from its `old`; a directory push checks it
/// again under the remote's locks.
pub fn push(
    repo: &Repository,
    git_dir: &Path,
    url: &str,
    updates: &[Update<'_>],
    last_check: Option<LastCheck<'_>>,
) -> Result<Pushed, TransportError> {
    let updates: Vec<Update<'_>> = updates
        .iter()
        .copied()
        .filter(|u| u.old != Some(u.new))
        .collect();
    if updates.is_empty() {
        return Ok(Pushed::Done);
    }
    if is_url(url) {
        if let Some(Err(why)) = last_check.map(|c| c()) {
            return Ok(Pushed::Refused(why));
        }
        push_cli(git_dir, url, &updates)
    } else {
        push_dir(repo, Path::new(url), &updates, last_check)
    }
}

/// Remove the lock files of `names` a dead writer left in the directory
/// remote at `url` (a killed host's `git receive-pack` or in-process push);
/// the names removed. Only for a caller that knows no live writer may hold
/// them — a new owner whose etcd lease outlived every earlier owner's.
/// Nothing for a URL remote (its locks are its server's).
pub(crate) fn clear_stale_locks(url: &str, names: &[&str]) -> Vec<String> {
    if is_url(url) {
        return Vec::new();
    }
    let mut cleared = Vec::new();
    for name in names {
        let lock = Path::new(url).join(format!("{name}.lock"));
        // The remote passed `remote_repo::check` (no symlinks): a lock is
        // a regular file, and only one is removed.
        let is_file = std::fs::symlink_metadata(&lock).is_ok_and(|m| m.file_type().is_file());
        if is_file && std::fs::remove_file(&lock).is_ok() {
            tracing::warn!(lock = %lock.display(), "removed a lock a dead writer left in the remote");
            cleared.push(format!("{name}.lock"));
        }
    }
    cleared
}

/// The value of `name` in `repo` (symbolic refs resolved), `None` when absent.
fn read_ref(repo: &Repository, name: &str) -> Result<Option<Oid>, TransportError> {
    match repo.find_reference(name) {
        Ok(r) => {
            let r = r.resolve().map_err(git("resolve a remote ref"))?;
            Ok(r.target())
        }
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(git("read a remote ref")(e)),
    }
}

fn fetch_dir(
    repo: &Repository,
    remote_dir: &Path,
    wanted: &[Wanted<'_>],
) -> Result<Vec<Option<Oid>>, TransportError> {
    let remote = open_bare(remote_dir)?;
    let tips: Vec<Option<Oid>> = wanted
        .iter()
        .map(|w| read_ref(&remote, w.remote))
        .collect::<Result<_, _>>()?;
    let local_odb = repo.odb().map_err(git("open the object database"))?;
    let missing: Vec<Oid> = tips
        .iter()
        .flatten()
        .copied()
        .filter(|t| !local_odb.exists(*t))
        .collect();
    if !missing.is_empty() {
        // What both sides have: the tracking refs as last fetched.
        let remote_odb = remote.odb().map_err(git("open the remote's objects"))?;
        let haves: Vec<Oid> = wanted
            .iter()
            .filter_map(|w| repo.refname_to_id(w.tracking).ok())
            .chain(repo.refname_to_id("refs/heads/main").ok())
            .filter(|h| remote_odb.exists(*h))
            .collect();
        check_sizes(&remote, &local_odb, &missing, &haves)?;
        copy_objects(&remote, repo, &missing, &haves)?;
    }
    for (w, tip) in wanted.iter().zip(&tips) {
        if let Some(t) = tip {
            repo.reference(w.tracking, *t, true, "mini-letta sync: fetched")
                .map_err(git("record the fetched remote ref"))?;
        }
    }
    Ok(tips)
}

fn push_dir(
    repo: &Repository,
    remote_dir: &Path,
    updates: &[Update<'_>],
    last_check: Option<LastCheck<'_>>,
) -> Result<Pushed, TransportError> {
    // One in-process pusher at a time; the locks a killed one left are
    // removed here (see `push_claim`). A fenced push (a cluster's owner,
    // `last_check` set) never waits: etcd decided who owns the agent, and
    // a holder is a host fenced out — paused, perhaps, and never to land.
    let fenced = last_check.is_some();
    let wait = if fenced {
        std::time::Duration::ZERO
    } else {
        push_claim::CLAIM_WAIT
    };
    let mut claim = match push_claim::take(remote_dir, wait) {
        Ok(c) => Some(c),
        Err(ClaimError::Busy(..)) if fenced => None,
        Err(e @ ClaimError::Busy(..)) => return Ok(Pushed::Rejected(e.to_string())),
        Err(e) => return Err(e.into()),
    };
    let remote = open_bare(remote_dir)?;
    let remote_odb = remote.odb().map_err(git("open the remote's objects"))?;
    let tips: Vec<Oid> = updates.iter().map(|u| u.new).collect();
    let haves: Vec<Oid> = updates
        .iter()
        .filter_map(|u| u.old)
        .filter(|o| remote_odb.exists(*o))
        .collect();
    // Objects first: no ref may ever name something the remote lacks.
    copy_objects(repo, &remote, &tips, &haves)?;
    let names: Vec<&str> = updates.iter().map(|u| u.name).collect();
    if let Some(claim) = claim.as_mut() {
        claim.locking(&names)?;
    }
    let mut tx = remote
        .transaction()
        .map_err(git("lock the remote's refs"))?;
    for u in updates {
        if let Err(e) = tx.lock_ref(u.name) {
            // Held by another writer (a git receive-pack, another host).
            return Ok(Pushed::Rejected(format!(
                "{} is being updated: {e}",
                u.name
            )));
        }
    }
    if let Some(why) = not_as_fetched(repo, &remote, updates)? {
        return Ok(Pushed::Rejected(why));
    }
    if let Some(Err(why)) = last_check.map(|c| c()) {
        return Ok(Pushed::Refused(why));
    }
    let sig = git2::Signature::now("mini-letta", "mini-letta@localhost")
        .map_err(git("sign the ref update"))?;
    let Some((last, first)) = updates.split_last() else {
        return Ok(Pushed::Done);
    };
    if first.is_empty() {
        tx.set_target(last.name, last.new, Some(&sig), "mini-letta sync: push")
            .map_err(git("update a remote ref"))?;
        tx.commit().map_err(git("update the remote's refs"))?;
        return Ok(Pushed::Done);
    }
    // libgit2 renames a transaction's locks in no set order: the others
    // land (the last one's lock released unchanged), then the last alone,
    // from the value just checked.
    for u in first {
        tx.set_target(u.name, u.new, Some(&sig), "mini-letta sync: push")
            .map_err(git("update a remote ref"))?;
    }
    tx.commit().map_err(git("update the remote's refs"))?;
    let mut tx = remote
        .transaction()
        .map_err(git("lock the remote's refs"))?;
    if let Err(e) = tx.lock_ref(last.name) {
        return Ok(Pushed::Rejected(format!(
            "{} is being updated: {e}",
            last.name
        )));
    }
    if read_ref(&remote, last.name)? != last.old {
        return Ok(Pushed::Rejected(format!(
            "{} moved on the remote while the push landed",
            last.name
        )));
    }
    tx.set_target(last.name, last.new, Some(&sig), "mini-letta sync: push")
        .map_err(git("update a remote ref"))?;
    tx.commit().map_err(git("update the remote's refs"))?;
    Ok(Pushed::Done)
}

/// Under the remote's ref locks: why a ref is no longer what was fetched
/// or would not move forward from it, if one is not.
fn not_as_fetched(
    repo: &Repository,
    remote: &Repository,
    updates: &[Update<'_>],
) -> Result<Option<String>, TransportError> {
    for u in updates {
        if read_ref(remote, u.name)? != u.old {
            return Ok(Some(format!(
                "{} moved on the remote since it was fetched",
                u.name
            )));
        }
        if let Some(old) = u.old
            && !repo
                .graph_descendant_of(u.new, old)
                .map_err(git("compare histories"))?
        {
            return Ok(Some(format!("{} would not be a fast-forward", u.name)));
        }
    }
    Ok(None)
}

/// Copy into `to` every object reachable from `tips` in `from` and not
/// from `haves` (which both have).
fn copy_objects(
    from: &Repository,
    to: &Repository,
    tips: &[Oid],
    haves: &[Oid],
) -> Result<(), TransportError> {
    let src = from.odb().map_err(git("open the object database"))?;
    let dst = to.odb().map_err(git("open the object database"))?;
    match missing_objects(from, &dst, tips, haves)? {
        Some(objects) => {
            for (id, kind) in objects {
                let obj = src.read(id).map_err(git("read an object"))?;
                let written = dst
                    .write(kind, obj.data())
                    .map_err(git("write an object"))?;
                if written != id {
                    return Err(git("copy an object")(git2::Error::from_str(&format!(
                        "object {id} hashes to {written}"
                    ))));
                }
            }
            Ok(())
        }
        None => copy_as_pack(from, &dst, tips, haves),
    }
}

/// What [`walk_new`] calls for each object: its id, kind and path (empty
/// for a commit and the root tree); `Break` stops the walk.
type Visit<'a> = dyn FnMut(Oid, ObjectType, &str) -> Result<ControlFlow<()>, TransportError> + 'a;

/// Visit every object `dst` lacks among those reachable from `tips` but
/// not `haves`, commits first and each tree before what it names; `visit`
/// stops the walk by answering `Break`. A tree `dst` already has is not
/// entered: all it names is there too.
fn walk_new(
    from: &Repository,
    dst: &Odb<'_>,
    tips: &[Oid],
    haves: &[Oid],
    visit: &mut Visit<'_>,
) -> Result<(), TransportError> {
    let mut walk = from.revwalk().map_err(git("walk history"))?;
    for t in tips {
        walk.push(*t).map_err(git("walk history"))?;
    }
    for h in haves {
        walk.hide(*h).map_err(git("walk history"))?;
    }
    let mut seen = std::collections::HashSet::new();
    for id in walk {
        let id = id.map_err(git("walk history"))?;
        if dst.exists(id) {
            continue;
        }
        if visit(id, ObjectType::Commit, "")?.is_break() {
            return Ok(());
        }
        let commit = from.find_commit(id).map_err(git("read a commit"))?;
        let mut trees = vec![(commit.tree_id(), String::new())];
        while let Some((tree_id, dir)) = trees.pop() {
            if !seen.insert(tree_id) || dst.exists(tree_id) {
                continue;
            }
            if visit(tree_id, ObjectType::Tree, &dir)?.is_break() {
                return Ok(());
            }
            let tree = from.find_tree(tree_id).map_err(git("read a tree"))?;
            for entry in tree.iter() {
                let path = || {
                    let name = String::from_utf8_lossy(entry.name_bytes());
                    if dir.is_empty() {
                        name.into_owned()
                    } else {
                        format!("{dir}/{name}")
                    }
                };
                match entry.kind() {
                    Some(ObjectType::Tree) => trees.push((entry.id(), path())),
                    Some(ObjectType::Blob)
                        if seen.insert(entry.id())
                            && !dst.exists(entry.id())
                            && visit(entry.id(), ObjectType::Blob, &path())?.is_break() =>
                    {
                        return Ok(());
                    }
                    // A gitlink names nothing here.
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// The objects `dst` lacks among those reachable from `tips` but not
/// `haves`, in an order where nothing precedes what it names last —
/// `None` once there are more than [`LOOSE_LIMIT`] (a pack is better).
fn missing_objects(
    from: &Repository,
    dst: &Odb<'_>,
    tips: &[Oid],
    haves: &[Oid],
) -> Result<Option<Vec<(Oid, ObjectType)>>, TransportError> {
    let mut found = Vec::new();
    let mut too_many = false;
    walk_new(from, dst, tips, haves, &mut |id, kind, _| {
        found.push((id, kind));
        too_many = found.len() > LOOSE_LIMIT;
        Ok(if too_many {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    })?;
    if too_many {
        return Ok(None);
    }
    // Blobs and trees before the commits that name them.
    found.reverse();
    Ok(Some(found))
}

/// Refuse, before anything is copied, an object `from` offers that is
/// larger than a memory's objects may be: its size is read from its header
/// (for a loose object, without inflating it whole).
fn check_sizes(
    from: &Repository,
    dst: &Odb<'_>,
    tips: &[Oid],
    haves: &[Oid],
) -> Result<(), TransportError> {
    let odb = from.odb().map_err(git("open the remote's objects"))?;
    walk_new(from, dst, tips, haves, &mut |id, kind, path| {
        let (size, _) = odb.read_header(id).map_err(git("read an object's size"))?;
        let (max, name) = match kind {
            ObjectType::Blob => (MAX_FETCHED_BLOB_BYTES, "file"),
            ObjectType::Tree => (MAX_FETCHED_META_BYTES, "tree"),
            _ => (MAX_FETCHED_META_BYTES, "commit"),
        };
        if size > max {
            return Err(TransportError::TooLarge {
                kind: name,
                path: (kind != ObjectType::Commit).then(|| {
                    if path.is_empty() {
                        "(the root tree)"
                    } else {
                        path
                    }
                    .to_string()
                }),
                id,
                size,
                max,
            });
        }
        Ok(ControlFlow::Continue(()))
    })
}

/// What a fetch of `name` from the directory remote `remote_dir` would
/// refuse for its size, if anything: read-only (object headers on the
/// remote, existence here), for `doctor`. `None` for a URL, a remote
/// without `name`, or nothing too large.
pub fn oversized(repo: &Repository, remote_dir: &str, name: &str) -> Option<String> {
    if is_url(remote_dir) {
        return None;
    }
    let remote = open_bare(Path::new(remote_dir)).ok()?;
    let tip = read_ref(&remote, name).ok()??;
    let local = repo.odb().ok()?;
    let haves: Vec<Oid> = repo
        .refname_to_id("refs/heads/main")
        .ok()
        .into_iter()
        .collect();
    let remote_odb = remote.odb().ok()?;
    let haves: Vec<Oid> = haves
        .into_iter()
        .filter(|h| remote_odb.exists(*h))
        .collect();
    match check_sizes(&remote, &local, &[tip], &haves) {
        Err(e @ TransportError::TooLarge { .. }) => Some(e.to_string()),
        _ => None,
    }
}

/// Copy the objects as one pack, indexed into `dst` by libgit2's indexer
/// (which hashes every object it receives).
fn copy_as_pack(
    from: &Repository,
    dst: &Odb<'_>,
    tips: &[Oid],
    haves: &[Oid],
) -> Result<(), TransportError> {
    let mut walk = from.revwalk().map_err(git("walk history"))?;
    for t in tips {
        walk.push(*t).map_err(git("walk history"))?;
    }
    for h in haves {
        walk.hide(*h).map_err(git("walk history"))?;
    }
    let mut pack = from.packbuilder().map_err(git("build a pack"))?;
    pack.insert_walk(&mut walk).map_err(git("build a pack"))?;
    let mut writer = dst.packwriter().map_err(git("write a pack"))?;
    let mut failed = None;
    pack.foreach(|chunk| match writer.write_all(chunk) {
        Ok(()) => true,
        Err(e) => {
            failed = Some(e);
            false
        }
    })
    .map_err(git("write a pack"))?;
    if let Some(e) = failed {
        return Err(git("write a pack")(git2::Error::from_str(&e.to_string())));
    }
    writer.commit().map_err(git("index a pack"))?;
    Ok(())
}

fn fetch_cli(
    repo: &Repository,
    git_dir: &Path,
    url: &str,
    wanted: &[Wanted<'_>],
) -> Result<Vec<Option<Oid>>, TransportError> {
    // `+` only on our own tracking refs: they mirror whatever the remote
    // has. A missing `main` is told apart by git's own message.
    let specs: Vec<String> = wanted
        .iter()
        .map(|w| format!("+{}:{}", w.remote, w.tracking))
        .collect();
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    let fetched = gitcli::fetch(git_dir, url, &specs)?;
    if !fetched.ok && fetched.stderr.contains("couldn't find remote ref") {
        // Which one: ask for each alone (a fresh remote has none at all).
        if wanted.len() > 1 {
            let mut tips = Vec::new();
            for w in wanted {
                tips.extend(fetch_cli(repo, git_dir, url, std::slice::from_ref(w))?);
            }
            return Ok(tips);
        }
        return Ok(vec![None]);
    }
    fetched.checked("fetch")?;
    wanted
        .iter()
        .map(|w| {
            repo.refname_to_id(w.tracking)
                .map(Some)
                .map_err(git("read a fetched ref"))
        })
        .collect()
}

fn push_cli(git_dir: &Path, url: &str, updates: &[Update<'_>]) -> Result<Pushed, TransportError> {
    let specs: Vec<String> = updates
        .iter()
        .map(|u| format!("{}:{}", u.new, u.name))
        .collect();
    let mut args = vec!["push", "--porcelain"];
    if updates.len() > 1 {
        args.push("--atomic");
    }
    args.extend(["--", url]);
    args.extend(specs.iter().map(String::as_str));
    let run = gitcli::run(Some(git_dir), &args)?;
    if run.ok {
        return Ok(Pushed::Done);
    }
    let text = format!("{}{}", run.stdout, run.stderr);
    let message = run.stderr.trim().to_string();
    // A remote that moved meanwhile is worth one fetch + rebase; anything
    // else (auth, hooks, network) is not.
    if ["[rejected]", "non-fast-forward", "fetch first"]
        .iter()
        .any(|w| text.contains(w))
    {
        Ok(Pushed::Rejected(message))
    } else {
        Ok(Pushed::Failed(message))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Both refs a fenced push moves: `(old, new)` of main and of the fence.
    fn main_and_fence(main: (Option<Oid>, Oid), fence: (Option<Oid>, Oid)) -> [Update<'static>; 2] {
        [
            Update {
                name: "refs/heads/main",
                old: main.0,
                new: main.1,
            },
            Update {
                name: "refs/mini-letta/fence",
                old: fence.0,
                new: fence.1,
            },
        ]
    }
    use std::path::PathBuf;

    fn commit(repo: &Repository, parent: Option<Oid>, text: &str) -> Oid {
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let blob = repo.blob(text.as_bytes()).unwrap();
        let mut tb = repo.treebuilder(None).unwrap();
        tb.insert("a.md", blob, 0o100644).unwrap();
        let tree = repo.find_tree(tb.write().unwrap()).unwrap();
        let parent = parent.map(|p| repo.find_commit(p).unwrap());
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        repo.commit(None, &sig, &sig, text, &tree, &parents)
            .unwrap()
    }

    /// A local repository and a bare remote, both holding `main` = one
    /// commit, and a fence ref on the remote.
    fn pair() -> (tempfile::TempDir, Repository, PathBuf, Oid, Oid) {
        let dir = tempfile::tempdir().unwrap();
        let local = Repository::init_bare(dir.path().join("local.git")).unwrap();
        let remote_dir = dir.path().join("remote.git");
        Repository::init_bare(&remote_dir).unwrap();
        let base = commit(&local, None, "base");
        let fence = commit(&local, None, "fence");
        let url = remote_dir.to_str().unwrap().to_string();
        let first = main_and_fence((None, base), (None, fence));
        assert_eq!(
            push(&local, local.path(), &url, &first, None).unwrap(),
            Pushed::Done
        );
        (dir, local, remote_dir, base, fence)
    }

    fn remote_ref(dir: &Path, name: &str) -> Option<Oid> {
        Repository::open_bare(dir).unwrap().refname_to_id(name).ok()
    }

    #[test]
    fn a_push_moves_every_ref_or_none() {
        let (_d, local, remote_dir, base, fence) = pair();
        let url = remote_dir.to_str().unwrap();
        let next = commit(&local, Some(base), "next");
        let stale_fence = commit(&local, None, "not the remote's fence");
        let new_fence = commit(&local, Some(stale_fence), "over the wrong fence");
        // The fence was not what this pusher fetched: main must not move.
        let refused = push(
            &local,
            local.path(),
            url,
            &main_and_fence((Some(base), next), (Some(stale_fence), new_fence)),
            None,
        )
        .unwrap();
        assert!(matches!(refused, Pushed::Rejected(_)), "{refused:?}");
        assert_eq!(remote_ref(&remote_dir, "refs/heads/main"), Some(base));
        assert_eq!(
            remote_ref(&remote_dir, "refs/mini-letta/fence"),
            Some(fence)
        );
        // Over the right one both move, and the objects are there.
        let good_fence = commit(&local, Some(fence), "over the remote's fence");
        let done = push(
            &local,
            local.path(),
            url,
            &main_and_fence((Some(base), next), (Some(fence), good_fence)),
            None,
        )
        .unwrap();
        assert_eq!(done, Pushed::Done);
        assert_eq!(remote_ref(&remote_dir, "refs/heads/main"), Some(next));
        let remote = Repository::open_bare(&remote_dir).unwrap();
        assert!(remote.find_commit(next).unwrap().tree().is_ok());
    }

    /// A pusher killed while it held the remote's ref locks (the soak's
    /// kill of a syncing supervisor) left them and its claim's record: the
    /// next push removes exactly those and lands. A lock nobody recorded
    /// (a live `git receive-pack`) still refuses the push.
    #[test]
    fn a_dead_pushers_ref_locks_do_not_block_the_next_push() {
        let (_d, local, remote_dir, base, _fence) = pair();
        let url = remote_dir.to_str().unwrap();
        let next = commit(&local, Some(base), "next");
        let updates = [Update {
            name: "refs/heads/main",
            old: Some(base),
            new: next,
        }];
        let lock = remote_dir.join("refs/heads/main.lock");
        std::fs::write(&lock, format!("{next}\n")).unwrap();
        let blocked = push(&local, local.path(), url, &updates, None).unwrap();
        assert!(
            matches!(&blocked, Pushed::Rejected(m) if m.contains("being updated")),
            "{blocked:?}"
        );
        assert!(lock.exists(), "an unrecorded lock is someone else's");
        std::fs::write(remote_dir.join("mini-letta-push"), "refs/heads/main\n").unwrap();
        assert_eq!(
            push(&local, local.path(), url, &updates, None).unwrap(),
            Pushed::Done
        );
        assert_eq!(remote_ref(&remote_dir, "refs/heads/main"), Some(next));
        assert!(!lock.exists());
        assert_eq!(
            std::fs::read(remote_dir.join("mini-letta-push")).unwrap(),
            b"",
            "a finished push leaves no record"
        );
    }

    /// Issue 43: the caller's last check runs under the remote's locks (a
    /// "no" moves nothing), and a dead writer's locks are cleared by name.
    #[test]
    fn the_last_check_runs_under_the_locks_and_stale_locks_clear() {
        let (_d, local, remote_dir, base, fence) = pair();
        let url = remote_dir.to_str().unwrap();
        let next = commit(&local, Some(base), "next");
        let new_fence = commit(&local, Some(fence), "over the remote's fence");
        let updates = main_and_fence((Some(base), next), (Some(fence), new_fence));
        let saw_locks = std::cell::Cell::new(false);
        let check = || {
            saw_locks.set(remote_dir.join("refs/heads/main.lock").exists());
            Err("lost the agent".to_string())
        };
        let refused = push(&local, local.path(), url, &updates, Some(&check)).unwrap();
        assert_eq!(refused, Pushed::Refused("lost the agent".into()));
        assert!(saw_locks.get(), "the check ran before the refs were locked");
        assert_eq!(remote_ref(&remote_dir, "refs/heads/main"), Some(base));
        assert_eq!(
            remote_ref(&remote_dir, "refs/mini-letta/fence"),
            Some(fence)
        );
        assert!(!remote_dir.join("refs/heads/main.lock").exists());
        // Locks left behind block the push until cleared.
        std::fs::write(remote_dir.join("refs/heads/main.lock"), format!("{next}\n")).unwrap();
        std::fs::write(remote_dir.join("refs/mini-letta/fence.lock"), "").unwrap();
        let blocked = push(&local, local.path(), url, &updates, None).unwrap();
        assert!(matches!(blocked, Pushed::Rejected(_)), "{blocked:?}");
        let cleared = clear_stale_locks(url, &["refs/heads/main", "refs/mini-letta/fence"]);
        assert_eq!(
            cleared,
            vec!["refs/heads/main.lock", "refs/mini-letta/fence.lock"]
        );
        assert_eq!(
            push(&local, local.path(), url, &updates, None).unwrap(),
            Pushed::Done
        );
        assert_eq!(remote_ref(&remote_dir, "refs/heads/main"), Some(next));
        assert_eq!(
            remote_ref(&remote_dir, "refs/mini-letta/fence"),
            Some(new_fence)
        );
        assert!(clear_stale_locks("ssh://h/x.git", &["refs/heads/main"]).is_empty());
    }

    /// Issue 43, LOW: a blob over a memory's file limit offered by the
    /// remote is refused from its header, before anything is copied; one
    /// within it is fetched.
    #[test]
    fn a_fetch_refuses_an_oversized_object_before_copying_anything() {
        let (_d, local, remote_dir, base, _fence) = pair();
        let remote = Repository::open_bare(&remote_dir).unwrap();
        let big = commit(&remote, Some(base), &"x".repeat(MAX_FETCHED_BLOB_BYTES + 1));
        remote
            .reference("refs/heads/main", big, true, "test: a hostile remote")
            .unwrap();
        let wanted = [Wanted {
            remote: "refs/heads/main",
            tracking: "refs/remotes/origin/main",
        }];
        let url = remote_dir.to_str().unwrap();
        let e = fetch(&local, local.path(), url, &wanted).unwrap_err();
        assert!(
            matches!(e, TransportError::TooLarge { kind: "file", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("nothing was fetched"), "{e}");
        assert!(
            e.to_string().starts_with(&format!(
                "a.md: {} bytes exceeds",
                MAX_FETCHED_BLOB_BYTES + 1
            )),
            "{e}"
        );
        assert!(oversized(&local, url, "refs/heads/main").is_some());
        let odb = local.odb().unwrap();
        assert!(!odb.exists(big), "the commit was copied");
        assert!(local.refname_to_id("refs/remotes/origin/main").is_err());
        let fine = commit(&remote, Some(base), &"y".repeat(1000));
        remote
            .reference("refs/heads/main", fine, true, "test: fixed")
            .unwrap();
        assert_eq!(
            fetch(&local, local.path(), url, &wanted).unwrap(),
            vec![Some(fine)]
        );
        assert_eq!(oversized(&local, url, "refs/heads/main"), None);
    }

    #[test]
    fn a_ref_locked_by_another_writer_is_a_rejection() {
        let (_d, local, remote_dir, base, _fence) = pair();
        let next = commit(&local, Some(base), "next");
        // A git receive-pack (or another host) is updating main.
        std::fs::write(remote_dir.join("refs/heads/main.lock"), "").unwrap();
        let pushed = push(
            &local,
            local.path(),
            remote_dir.to_str().unwrap(),
            &[Update {
                name: "refs/heads/main",
                old: Some(base),
                new: next,
            }],
            None,
        )
        .unwrap();
        assert!(matches!(pushed, Pushed::Rejected(_)), "{pushed:?}");
        std::fs::remove_file(remote_dir.join("refs/heads/main.lock")).unwrap();
        assert_eq!(remote_ref(&remote_dir, "refs/heads/main"), Some(base));
    }

    #[test]
    fn a_push_that_is_no_fast_forward_is_refused_even_when_old_matches() {
        let (_d, local, remote_dir, base, _fence) = pair();
        // A commit not descending from the remote's main.
        let other = commit(&local, None, "unrelated");
        let pushed = push(
            &local,
            local.path(),
            remote_dir.to_str().unwrap(),
            &[Update {
                name: "refs/heads/main",
                old: Some(base),
                new: other,
            }],
            None,
        )
        .unwrap();
        assert!(matches!(pushed, Pushed::Rejected(_)), "{pushed:?}");
        assert_eq!(remote_ref(&remote_dir, "refs/heads/main"), Some(base));
    }

    #[test]
    fn fetch_copies_a_large_history_as_a_pack_and_a_small_one_loose() {
        let dir = tempfile::tempdir().unwrap();
        let remote_dir = dir.path().join("remote.git");
        let remote = Repository::init_bare(&remote_dir).unwrap();
        let mut tip = commit(&remote, None, "0");
        for i in 1..150 {
            tip = commit(&remote, Some(tip), &i.to_string());
        }
        remote.reference("refs/heads/main", tip, true, "t").unwrap();
        let local = Repository::init_bare(dir.path().join("local.git")).unwrap();
        let wanted = [Wanted {
            remote: "refs/heads/main",
            tracking: "refs/remotes/origin/main",
        }];
        let url = remote_dir.to_str().unwrap();
        let tips = fetch(&local, local.path(), url, &wanted).unwrap();
        assert_eq!(tips, vec![Some(tip)]);
        let packs = |r: &Repository| {
            std::fs::read_dir(r.path().join("objects/pack"))
                .map(|d| d.count())
                .unwrap_or(0)
        };
        assert!(packs(&local) >= 2, "a pack and its index");
        let mut walk = local.revwalk().unwrap();
        walk.push(tip).unwrap();
        assert_eq!(walk.count(), 150);
        // One more commit comes loose.
        let more = commit(&remote, Some(tip), "one more");
        remote
            .reference("refs/heads/main", more, true, "t")
            .unwrap();
        let before = packs(&local);
        assert_eq!(
            fetch(&local, local.path(), url, &wanted).unwrap(),
            vec![Some(more)]
        );
        assert_eq!(packs(&local), before);
        assert!(local.find_commit(more).unwrap().tree().is_ok());
        // A remote without the ref: `None`, the tracking ref kept.
        let absent = [Wanted {
            remote: "refs/mini-letta/fence",
            tracking: "refs/remotes/origin/fence",
        }];
        assert_eq!(
            fetch(&local, local.path(), url, &absent).unwrap(),
            vec![None]
        );
    }
}
