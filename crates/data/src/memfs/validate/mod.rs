//! The MemFS commit validator: decides whether a candidate tree (normally the
//! staged index) may be committed, and produces the exact text the
//! pre-commit hook prints (spec `memfs-git.md` §1.3, §1.4, §2, §7.4).
//!
//! It is a pure library function over [`TreeSnapshot`]s: the caller supplies
//! the candidate tree, the accepted tree (`HEAD`, absent before the first
//! commit), the layout policy and whether a human approved a change to
//! `.memfs.config.json` (`MINI_LETTA_CONSTRAINTS_UPDATE=1`; see
//! [`constraints_update_approved_from_env`]). Nothing here reads the working
//! tree or the environment.
//!
//! Stages, as in letta-code's hook:
//! 1. **Per-file stage.** v2 (`root-marker` with a root `MEMORY.md` staged or
//!    in `HEAD`, or `shared-memory`): flat skill files among added/changed
//!    paths, then the frontmatter rules for every tracked memory Markdown
//!    file of the *whole* tree. Legacy: flat skills, then frontmatter of
//!    added/changed `system/`/`reference/` files against their `HEAD`
//!    content. Any error stops here (`Memory validation failed:` /
//!    `Frontmatter validation failed:`).
//! 2. **Constraints stage** (`Memory validation blocked this commit.`):
//!    config approval, config parsing, then root marker, indexes (first
//!    missing per file), `readOnlyFiles`, regular files, formatting, depth,
//!    per-file characters, core budget — then the [B] rules below.
//!
//! mini-letta additions ([B], switchable in [`ValidateOptions`]):
//! * Hard byte limit on every regular file (default 1 MiB):
//!   `<path>: <n> bytes exceeds the 1048576-byte file limit`.
//! * Secret scan of every regular file for private-key blocks, AWS/Google
//!   keys, `sk-…`, GitHub, Slack and JWT-shaped tokens:
//!   `<path>:<line>: possible secret (<kind>); remove it or add the path to
//!   secretScanAllow in .memfs.config.json`. `secretScanAllow` (globs) is an
//!   extra key of the protected config. The scan covers whole files, so a
//!   secret completed by a second commit is caught then.
//! * `<path>: path is not valid UTF-8` (invalid bytes shown as `\xNN`) and
//!   `<path>: memory Markdown must be valid UTF-8 text`, in the per-file stage.
//! * The tree's shape (`tree_safety`), for every tree whoever made it —
//!   a local commit, a merge, an import, a remote a sync would move to:
//!   `<path>: a path inside .git is not memory and is never checked out`
//!   (any case), `<path>: git metadata (.gitmodules, .gitattributes) is not
//!   allowed in memory`, `<path>: gitlinks (submodules) are not allowed in
//!   memory`, `<path>: symbolic link points outside the memory directory`
//!   (leaving the tree or entering `.git`, judged lexically), `<path>:
//!   differs only in case from <other>`, and `<path>: name contains the
//!   control character U+001B` (the rule of `crate::names`; such characters
//!   are shown escaped).
//!
//! Where we deliberately differ from letta-code:
//! * Snapshots, not `git ls-files`/`git show`: no subprocess, no path quoting,
//!   no command-line limits.
//! * Renames are not detected: a renamed path counts as added (checked again,
//!   never less). Type changes count as changes for the flat-skill rule.
//! * Non-regular memory Markdown (symlink, gitlink) is not read as text in
//!   the per-file stage (letta reads a symlink's target path as content); the
//!   constraints stage reports it as `memory Markdown must be a regular file`.
//! * `readOnlyFiles` compares mode and object id instead of bytes (the same
//!   thing for content-addressed blobs), so "cannot read protected file"
//!   cannot happen.
//! * `invalid JSON (<message>)` carries serde_json's message, not V8's.
//! * Audit mode judges a revision against its own tree (no approval check,
//!   no frontmatter stage, `readOnlyFiles` trivially unchanged).
//! * An index with unmerged entries is an error, not a candidate.
//! * The legacy [M] "read_only file cannot be deleted or renamed" side-branch
//!   rule is not implemented; v2 protects files with `readOnlyFiles`.
//! * The guidance line keeps the spec's "Letta Code defaults" wording, since
//!   the spec requires the message text byte for byte.

mod config;
mod constraints;
mod error;
mod extensions;
mod frontmatter_check;
mod glob;
mod options;
mod report;
mod secrets;
mod snapshot;
mod tree_safety;

use git2::{Oid, Repository};

pub use config::{
    CONFIG_PATH, CONFIG_VERSION, ConstraintsConfig, DEFAULT_CONFIG_CONTENT,
    DEFAULT_MAX_CORE_MEMORY_CHARACTERS, DEFAULT_MAX_DEPTH, DEFAULT_MAX_FILE_CHARACTERS,
    FileCharacterLimit, Formatting, parse_config,
};
pub use constraints::count_code_points;
pub use error::ValidateError;
pub use frontmatter_check::{FrontmatterFormat, validate_memory_file_frontmatter};
pub use glob::{Glob, PatternError, check_pattern};
pub use options::{
    CONSTRAINTS_UPDATE_ENV, MAX_FILE_BYTES, Policy, ROOT_INDEX, ValidateOptions,
    constraints_update_approved_from_env,
};
pub use report::{Block, Report, Rule, Violation};
pub use secrets::{Finding, SecretKind, scan as scan_secrets};
pub use snapshot::{Entry, TreeSnapshot, display_path};
pub use tree_safety::CaseIndex;
pub(crate) use tree_safety::link_stays_inside;

use config::ConstraintsConfig as Config;
use constraints::{
    TreeOptions, first_missing_index, is_legacy_memory_path, validate_tree_constraints,
};
use error::{Stage, read_blob};

/// Validate a candidate tree (normally the staged index) for a commit whose
/// parent tree is `accepted` (`None` before the first commit).
pub fn validate(
    repo: &Repository,
    candidate: &TreeSnapshot,
    accepted: Option<&TreeSnapshot>,
    opts: &ValidateOptions,
) -> Result<Report, ValidateError> {
    let empty = TreeSnapshot::new();
    let acc = accepted.unwrap_or(&empty);
    let v2 = match opts.policy {
        Policy::SharedMemory => true,
        Policy::RootMarker => candidate.contains(ROOT_INDEX) || acc.contains(ROOT_INDEX),
        Policy::LegacyOnly => false,
    };
    let mut errors = non_utf8_path_violations(candidate);
    if v2 {
        memory_file_stage(repo, candidate, acc, opts.policy, &mut errors)?;
    } else {
        legacy_frontmatter_stage(repo, candidate, acc, &mut errors)?;
    }
    if !errors.is_empty() {
        return Ok(Report {
            block: if v2 {
                Block::MemoryFiles
            } else {
                Block::LegacyFrontmatter
            },
            policy: opts.policy,
            violations: errors,
        });
    }
    let violations = constraints_stage(repo, candidate, accepted, opts, false)?;
    Ok(Report {
        block: Block::Constraints,
        policy: opts.policy,
        violations,
    })
}

/// Validate the repository's on-disk index against `HEAD`.
pub fn validate_staged(repo: &Repository, opts: &ValidateOptions) -> Result<Report, ValidateError> {
    let index = repo.index().map_err(ValidateError::Snapshot)?;
    let candidate = TreeSnapshot::from_index(&index)?;
    let head = TreeSnapshot::from_head(repo)?;
    validate(repo, &candidate, head.as_ref(), opts)
}

/// Audit a committed tree against its own config (structure, budgets,
/// config and the [B] rules; no frontmatter, no approval check). Render
/// with [`Report::render_audit`].
pub fn audit(
    repo: &Repository,
    tree: &TreeSnapshot,
    opts: &ValidateOptions,
) -> Result<Report, ValidateError> {
    let mut violations = non_utf8_path_violations(tree);
    violations.extend(constraints_stage(repo, tree, Some(tree), opts, true)?);
    Ok(Report {
        block: Block::Constraints,
        policy: opts.policy,
        violations,
    })
}

/// Audit a revision; the policy is chosen from the revision itself
/// (root-marker iff it has a root `MEMORY.md`), overriding `opts.policy`.
pub fn audit_revision(
    repo: &Repository,
    rev: &str,
    opts: &ValidateOptions,
) -> Result<Report, ValidateError> {
    let tree = TreeSnapshot::from_revision(repo, rev)?;
    let opts = ValidateOptions {
        policy: Policy::for_audit(&tree),
        ..opts.clone()
    };
    audit(repo, &tree, &opts)
}

fn non_utf8_path_violations(tree: &TreeSnapshot) -> Vec<Violation> {
    tree.non_utf8_paths()
        .map(|(bytes, _)| {
            let shown = display_path(bytes);
            Violation::new(
                Some(&shown),
                Rule::NonUtf8Path,
                format!("{shown}: path is not valid UTF-8"),
            )
        })
        .collect()
}

/// `skills/<file>.md` (v2) or `(memory/)?skills/<file>.md` (legacy).
fn is_flat_skill(path: &str, legacy: bool) -> bool {
    let p = if legacy {
        path.strip_prefix("memory/").unwrap_or(path)
    } else {
        path
    };
    p.strip_prefix("skills/").is_some_and(|name| {
        name.len() > ".md".len() && name.ends_with(".md") && !name.contains('/')
    })
}

fn flat_skill_violations(
    candidate: &TreeSnapshot,
    acc: &TreeSnapshot,
    legacy: bool,
    out: &mut Vec<Violation>,
) {
    for (path, entry) in candidate.iter() {
        if is_flat_skill(path, legacy) && acc.get(path) != Some(entry) {
            out.push(Violation::new(
                Some(path),
                Rule::FlatSkill,
                format!("{path}: invalid skill path (skills must be folders). Use skills/<name>/SKILL.md"),
            ));
        }
    }
}

/// Text of a memory file, or a violation when it is not UTF-8.
fn memory_text(
    repo: &Repository,
    path: &str,
    oid: Oid,
    out: &mut Vec<Violation>,
) -> Result<Option<String>, ValidateError> {
    let bytes = read_blob(repo, path, oid, Stage::MemoryFiles)?;
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Some(text)),
        Err(_) => {
            out.push(Violation::new(
                Some(path),
                Rule::NonUtf8Content,
                format!("{path}: memory Markdown must be valid UTF-8 text"),
            ));
            Ok(None)
        }
    }
}

/// v2 per-file stage over the whole candidate tree.
fn memory_file_stage(
    repo: &Repository,
    candidate: &TreeSnapshot,
    acc: &TreeSnapshot,
    policy: Policy,
    out: &mut Vec<Violation>,
) -> Result<(), ValidateError> {
    flat_skill_violations(candidate, acc, false, out);
    for (path, entry) in candidate.iter() {
        if !path.ends_with(".md") || path.starts_with("skills/") || !entry.is_regular() {
            continue;
        }
        // Root-marker: only projected files (every ancestor has a staged
        // index); the constraints stage reports the missing indexes.
        if policy == Policy::RootMarker
            && first_missing_index(path, &|p: &str| candidate.contains(p)).is_some()
        {
            continue;
        }
        if let Some(text) = memory_text(repo, path, entry.oid, out)? {
            for message in
                validate_memory_file_frontmatter(path, &text, None, FrontmatterFormat::MemfsV2)
            {
                out.push(Violation::new(Some(path), Rule::Frontmatter, message));
            }
        }
    }
    Ok(())
}

/// Legacy per-file stage over added/changed `system/`/`reference/` files.
fn legacy_frontmatter_stage(
    repo: &Repository,
    candidate: &TreeSnapshot,
    acc: &TreeSnapshot,
    out: &mut Vec<Violation>,
) -> Result<(), ValidateError> {
    flat_skill_violations(candidate, acc, true, out);
    for (path, entry) in candidate.iter() {
        let changed = acc.get(path) != Some(entry);
        if !changed || !is_legacy_memory_path(path) || !entry.is_regular() {
            continue;
        }
        let Some(text) = memory_text(repo, path, entry.oid, out)? else {
            continue;
        };
        // Like `git show HEAD:<path> || true`: an unreadable previous
        // version is treated as absent.
        let previous = acc
            .get(path)
            .filter(|e| e.is_regular())
            .and_then(|e| repo.find_blob(e.oid).ok())
            .map(|b| String::from_utf8_lossy(b.content()).into_owned());
        for message in validate_memory_file_frontmatter(
            path,
            &text,
            previous.as_deref(),
            FrontmatterFormat::Legacy,
        ) {
            out.push(Violation::new(Some(path), Rule::Frontmatter, message));
        }
    }
    Ok(())
}

/// The constraints stage (spec §2.5 order) plus the [B] rules.
fn constraints_stage(
    repo: &Repository,
    candidate: &TreeSnapshot,
    accepted: Option<&TreeSnapshot>,
    opts: &ValidateOptions,
    audit: bool,
) -> Result<Vec<Violation>, ValidateError> {
    let empty = TreeSnapshot::new();
    let acc = accepted.unwrap_or(&empty);
    let mut errors = Vec::new();
    let root_marker = opts.policy == Policy::RootMarker;
    let has_v2_root = root_marker && (candidate.contains(ROOT_INDEX) || acc.contains(ROOT_INDEX));
    let staged_config = candidate.get(CONFIG_PATH);
    let accepted_config = acc.get(CONFIG_PATH);

    if !has_v2_root && staged_config.is_none() && accepted_config.is_none() {
        // letta-code would not run its constraints here; ours still apply.
        return extensions::validate_extensions(repo, candidate, opts, &[]);
    }
    if !audit && staged_config != accepted_config && !opts.constraints_update_approved {
        errors.push(Violation::new(
            Some(CONFIG_PATH),
            Rule::ConfigProtected,
            format!("{CONFIG_PATH} is protected and requires human approval to change"),
        ));
    }
    let config = match staged_config {
        None if !has_v2_root => {
            // Config deleted (or only in HEAD) outside v2: nothing to apply.
            if errors.is_empty() {
                errors.extend(extensions::validate_extensions(repo, candidate, opts, &[])?);
            }
            return Ok(errors);
        }
        None => Config::defaults(),
        Some(entry) => {
            if !entry.is_regular() {
                errors.push(Violation::new(
                    Some(CONFIG_PATH),
                    Rule::ConfigNotRegular,
                    format!("{CONFIG_PATH}: constraint config must be a regular file"),
                ));
                return Ok(errors);
            }
            let bytes = read_blob(repo, CONFIG_PATH, entry.oid, Stage::Constraints)?;
            match parse_config(&String::from_utf8_lossy(&bytes)) {
                Err(list) => {
                    errors.extend(
                        list.into_iter()
                            .map(|m| Violation::new(Some(CONFIG_PATH), Rule::ConfigInvalid, m)),
                    );
                    return Ok(errors);
                }
                // Tree checks never run on top of an approval error.
                Ok(_) if !errors.is_empty() => return Ok(errors),
                Ok(parsed) if root_marker => parsed.over_defaults(),
                Ok(parsed) => parsed,
            }
        }
    };
    let tree_opts = TreeOptions {
        config: &config,
        policy: opts.policy,
        require_root_marker: acc.contains(ROOT_INDEX),
        accepted,
    };
    errors.extend(validate_tree_constraints(repo, candidate, &tree_opts)?);
    let ours = extensions::validate_extensions(repo, candidate, opts, &config.secret_scan_allow)?;
    let ours = tree_safety::without_repeats(ours, &errors);
    errors.extend(ours);
    Ok(errors)
}
