//! [B] mini-letta rules that letta-code's hook does not have: the tree's
//! shape (`tree_safety`), the hard per-file byte limit (book Lab 2) and the
//! secret scan (chapter 19). All cover every entry in the snapshot, not only
//! memory Markdown.

use git2::Repository;

use super::error::{Stage, ValidateError, read_blob};
use super::glob::Glob;
use super::options::ValidateOptions;
use super::report::{Rule, Violation};
use super::snapshot::TreeSnapshot;
use super::{config::CONFIG_PATH, secrets};

pub(crate) fn validate_extensions(
    repo: &Repository,
    tree: &TreeSnapshot,
    opts: &ValidateOptions,
    secret_scan_allow: &[String],
) -> Result<Vec<Violation>, ValidateError> {
    let mut out = if opts.tree_safety {
        super::tree_safety::violations(repo, tree)?
    } else {
        Vec::new()
    };
    if opts.max_file_bytes.is_none() && !opts.secret_scan {
        return Ok(out);
    }
    let odb = repo
        .odb()
        .map_err(|source| ValidateError::ConstraintsRead {
            path: String::new(),
            source,
        })?;
    let allow: Vec<Glob> = secret_scan_allow.iter().map(|p| Glob::new(p)).collect();
    for (path, entry) in tree.iter() {
        // Symlink targets and gitlinks hold no file content of their own.
        if !entry.is_regular() {
            continue;
        }
        if let Some(max) = opts.max_file_bytes {
            // The object header gives the size without loading the blob.
            let (size, _) =
                odb.read_header(entry.oid)
                    .map_err(|source| ValidateError::ConstraintsRead {
                        path: path.to_string(),
                        source,
                    })?;
            let size = size as u64;
            if size > max {
                out.push(Violation::new(
                    Some(path),
                    Rule::FileBytes,
                    format!("{path}: {size} bytes exceeds the {max}-byte file limit"),
                ));
                // Already blocked; scanning a huge blob would only cost time.
                continue;
            }
        }
        if !opts.secret_scan || allow.iter().any(|g| g.is_match(path)) {
            continue;
        }
        let bytes = read_blob(repo, path, entry.oid, Stage::Constraints)?;
        for finding in secrets::scan(&bytes) {
            out.push(Violation::new(
                Some(path),
                Rule::Secret,
                format!(
                    "{path}:{}: possible secret ({}); remove it or add the path to secretScanAllow in {CONFIG_PATH}",
                    finding.line,
                    finding.kind.label()
                ),
            ));
        }
    }
    Ok(out)
}
