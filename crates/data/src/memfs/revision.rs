//! Resolving a revision a person typed (`HEAD~2`, a commit id, a branch)
//! to a tree, with errors that say what was wrong in words rather than
//! libgit2's class and code numbers.

use git2::{ErrorCode, Oid, Repository, Tree};

/// Why a revision could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RevisionError {
    #[error("unknown revision \"{0}\"")]
    Unknown(String),
    #[error("ambiguous revision \"{0}\": more than one object starts with it")]
    Ambiguous(String),
    #[error("revision \"{0}\" names neither a commit nor a tree")]
    NotATree(String),
    #[error("cannot resolve revision \"{rev}\": {}", source.message())]
    Git { rev: String, source: git2::Error },
}

/// The object `rev` names and its tree.
pub(crate) fn resolve_tree<'r>(
    repo: &'r Repository,
    rev: &str,
) -> Result<(Oid, Tree<'r>), RevisionError> {
    let object = repo
        .revparse_single(rev)
        .map_err(|source| match source.code() {
            ErrorCode::NotFound | ErrorCode::InvalidSpec | ErrorCode::UnbornBranch => {
                RevisionError::Unknown(rev.to_string())
            }
            ErrorCode::Ambiguous => RevisionError::Ambiguous(rev.to_string()),
            _ => RevisionError::Git {
                rev: rev.to_string(),
                source,
            },
        })?;
    let tree = object
        .peel_to_tree()
        .map_err(|_| RevisionError::NotATree(rev.to_string()))?;
    Ok((object.id(), tree))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn repo_with_commit() -> (tempfile::TempDir, Repository, Oid) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let id = {
            let blob = repo.blob(b"x\n").unwrap();
            let mut tb = repo.treebuilder(None).unwrap();
            tb.insert("a.md", blob, 0o100644).unwrap();
            let tree = repo.find_tree(tb.write().unwrap()).unwrap();
            let sig = git2::Signature::now("t", "t@example.com").unwrap();
            repo.commit(Some("HEAD"), &sig, &sig, "first", &tree, &[])
                .unwrap()
        };
        (dir, repo, id)
    }

    #[test]
    fn revisions_resolve_or_fail_in_words() {
        let (_dir, repo, id) = repo_with_commit();
        assert_eq!(resolve_tree(&repo, "HEAD").unwrap().0, id);
        for bad in [
            "badrev",
            "HEAD~5",
            "0123456789abcdef0123456789abcdef01234567",
            "a..b^^{",
        ] {
            let e = resolve_tree(&repo, bad).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("unknown revision \"{bad}\""),
                "{e:?}"
            );
        }
        let blob = repo.blob(b"y\n").unwrap();
        let e = resolve_tree(&repo, &blob.to_string()).unwrap_err();
        assert!(matches!(e, RevisionError::NotATree(_)), "{e:?}");
        assert!(!e.to_string().contains("class="), "{e}");
    }
}
