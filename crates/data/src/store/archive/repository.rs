//! The unpacked repository made trustworthy: every object a ref reaches
//! is the archive's own, `HEAD`'s tree passes the validator; then its
//! layout policy, hook and index are written fresh.

use super::error::{ArchiveError, bad_repo};
use crate::memfs::validate::{self, Policy, ValidateOptions};
use crate::memfs::{hook, repo};
use crate::paths::AgentPaths;

/// Objects walked when checking an imported history.
const MAX_OBJECTS: usize = 10_000_000;

/// The unpacked repository: `HEAD` resolves, every object any ref reaches
/// is in its own object store, `HEAD`'s tree passes the validator; then
/// the layout policy, the hook and an index matching `HEAD` are written.
pub fn finish_repository(paths: &AgentPaths, policy: Option<Policy>) -> Result<(), ArchiveError> {
    let git_dir = paths.memory_git_dir();
    // Sealed (`repo::seal`): objects are read from `objects/` alone.
    let repo = repo::open_agent(paths)?;
    // Names resolved to ids without reading objects: what is missing is
    // reported by the connectivity check, by id.
    let head_id = repo
        .refname_to_id("HEAD")
        .map_err(|e| bad_repo(format!("HEAD does not resolve: {}", e.message())))?;
    let mut tips = vec![("HEAD".to_string(), head_id)];
    for r in repo.references().map_err(bad_repo)? {
        let r = r.map_err(bad_repo)?;
        let name = r.name().unwrap_or("?").to_string();
        let target = r
            .resolve()
            .ok()
            .and_then(|r| r.target())
            .ok_or_else(|| bad_repo(format!("{name} does not resolve")))?;
        tips.push((name, target));
    }
    check_connected(&repo, &tips)?;
    let head = repo.find_commit(head_id).map_err(|e| {
        bad_repo(format!(
            "HEAD does not resolve to a commit: {}",
            e.message()
        ))
    })?;
    let tree = head.tree().map_err(bad_repo)?;

    let policy = policy.unwrap_or(Policy::RootMarker);
    let report = validate::audit_revision(&repo, "HEAD", &ValidateOptions::new(policy))
        .map_err(|e| ArchiveError::InvalidMemory(e.to_string()))?;
    if !report.is_ok() {
        return Err(ArchiveError::InvalidMemory(report.render_audit()));
    }

    let mut index = repo.index().map_err(bad_repo)?;
    index.read_tree(&tree).map_err(bad_repo)?;
    index.write().map_err(bad_repo)?;
    hook::write_layout_policy(&git_dir, policy)?;
    if let Some(bin) = hook::self_binary() {
        hook::install(&git_dir, &bin)?;
    }
    Ok(())
}

/// Every object reachable from `tips` (commits, their parents and trees,
/// trees' entries, tags' targets) is in `repo`'s object store — which,
/// opened sealed, is the archive's own: an archive borrowing objects from
/// anywhere else is refused, naming the first one it lacks.
fn check_connected(
    repo: &git2::Repository,
    tips: &[(String, git2::Oid)],
) -> Result<(), ArchiveError> {
    use git2::ObjectType;
    let odb = repo.odb().map_err(bad_repo)?;
    let mut seen = std::collections::HashSet::new();
    let mut todo: Vec<(git2::Oid, ObjectType, String)> = tips
        .iter()
        .map(|(name, oid)| (*oid, ObjectType::Any, name.clone()))
        .collect();
    while let Some((oid, kind, from)) = todo.pop() {
        if !seen.insert(oid) {
            continue;
        }
        if seen.len() > MAX_OBJECTS {
            return Err(bad_repo(format!("more than {MAX_OBJECTS} objects")));
        }
        let missing = || {
            bad_repo(format!(
                "object {oid} (reached from {from}) is missing from the archive's own objects; \
                 an archive must carry every object its branches reach"
            ))
        };
        if kind == ObjectType::Blob {
            if !odb.exists(oid) {
                return Err(missing());
            }
            continue;
        }
        let object = repo.find_object(oid, None).map_err(|_| missing())?;
        match object.kind() {
            Some(ObjectType::Commit) => {
                let commit = object.peel_to_commit().map_err(bad_repo)?;
                let here = format!("commit {oid}");
                todo.push((commit.tree_id(), ObjectType::Tree, here.clone()));
                for parent in commit.parent_ids() {
                    todo.push((parent, ObjectType::Commit, here.clone()));
                }
            }
            Some(ObjectType::Tree) => {
                let tree = object.peel_to_tree().map_err(bad_repo)?;
                for e in tree.iter() {
                    let path = format!("{from}: {}", e.name().unwrap_or("?"));
                    // Gitlinks name another repository's commit: the
                    // validator judges them.
                    if let Some(k @ (ObjectType::Blob | ObjectType::Tree)) = e.kind() {
                        todo.push((e.id(), k, path));
                    }
                }
            }
            Some(ObjectType::Tag) => {
                let tag = object
                    .into_tag()
                    .map_err(|_| bad_repo(format!("tag {oid}")))?;
                todo.push((tag.target_id(), ObjectType::Any, format!("tag {oid}")));
            }
            _ => {}
        }
    }
    Ok(())
}
