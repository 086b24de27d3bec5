//! `mini-letta doctor`: what is wrong with an agent, and how to fix it
//! (book chapter 20). Every check reads; none changes anything. Each finding
//! is one line with a severity, what was found and a fix.
//!
//! The checks, in order: the checkout is clean (no uncommitted edit, no
//! unfinished merge or rebase); the committed tree passes the validator;
//! files over 80 % of their size limit; broken links in `MEMORY.md` indexes;
//! conversations more than 50 steps past their last reflection; a stale
//! `reflection.lock`; orphan memory worktrees and kept branches; sync state;
//! a sandbox level below what this host could give; a missing or stale
//! recall index.

use git2::Repository;
use serde::Serialize;

use crate::memfs::validate::{self, CONFIG_PATH, ValidateOptions};
use crate::paths::{AgentPaths, Home};
use crate::store::record::AgentRecord;

/// Steps since the last reflection above which a conversation is overdue.
pub const REFLECTION_OVERDUE_STEPS: u64 = 50;

/// The share of a file's size limit above which it is reported.
pub const NEAR_LIMIT_PERCENT: u64 = 80;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Memory or history is at risk, or something no longer works.
    Error,
    /// Works, but needs attention soon.
    Warning,
    /// Worth knowing; nothing is wrong.
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warning => "warning",
            Self::Info => "info",
        }
    }
}

/// One thing doctor found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which check found it (`git_status`, `validator`, …).
    pub check: &'static str,
    pub severity: Severity,
    pub message: String,
    /// What to do about it.
    pub fix: String,
}

/// The checks, in the order they run.
pub const CHECKS: &[&str] = &[
    "home",
    "config",
    "git_status",
    "validator",
    "file_size",
    "index_links",
    "reflection_due",
    "reflection_lock",
    "worktrees",
    "sync",
    "sandbox",
    "recall_index",
];

/// What doctor found for one agent.
#[derive(Debug, Clone, Serialize)]
pub struct Diagnosis {
    pub agent: String,
    pub name: String,
    /// No error or warning.
    pub healthy: bool,
    pub checks: Vec<&'static str>,
    pub findings: Vec<Finding>,
}

/// Where to look beyond the agent itself.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The remote root sync uses, if any.
    pub remote_root: Option<String>,
    /// This host's sandbox report (`None`: the sandbox check is skipped).
    pub sandbox: Option<crate::sandbox::report::SandboxReport>,
    /// Whether a supervisor runs on this home (its sub-agents' worktrees
    /// are then not orphans).
    pub supervisor_running: bool,
    /// The home, for the checks a turn makes before it starts (issue 44:
    /// doctor said "healthy" when no turn could run). `None`: skipped.
    pub home: Option<Home>,
}

struct Out {
    findings: Vec<Finding>,
}

impl Out {
    fn push(&mut self, check: &'static str, severity: Severity, message: String, fix: String) {
        self.findings.push(Finding {
            check,
            severity,
            message,
            fix,
        });
    }
}

/// Diagnose one agent.
pub(crate) fn diagnose(record: &AgentRecord, agent: &AgentPaths, ctx: &Context) -> Diagnosis {
    let mut out = Out {
        findings: Vec::new(),
    };
    let sel = &record.name;
    if let Some(home) = &ctx.home {
        home_reachable(&mut out, home);
        audit_disk(&mut out, home);
        config(&mut out, home, record);
    }
    match crate::memfs::repo::open_agent(agent) {
        Ok(repo) => {
            git_status(&mut out, &repo, agent, sel);
            validator(&mut out, &repo, agent, sel);
            file_size(&mut out, &repo);
            index_links(&mut out, &repo);
            worktrees(&mut out, &repo, agent, ctx, sel);
            failing_workers(&mut out, agent, sel);
            sync_state(&mut out, &repo, ctx, sel);
            if let Some(root) = &ctx.remote_root {
                remote_refused(&mut out, &repo, agent, &record.id, root);
            }
        }
        Err(crate::memfs::repo::RepoError::Planted { path, what }) => out.push(
            "git_status",
            Severity::Error,
            format!(
                "{} is there: the file {what}, so every command refuses the memory repository",
                path.display()
            ),
            format!(
                "mini-letta never makes it: find out who planted it (an archive, a remote, \
someone with root), then remove it: rm -r -- '{}'",
                path.display()
            ),
        ),
        Err(e) => out.push(
            "git_status",
            Severity::Error,
            format!("the memory repository cannot be opened: {e}"),
            "restore the agent from an export (`mini-letta agent import`) or its remote \
(`mini-letta sync`)"
                .into(),
        ),
    }
    reflection_due(&mut out, agent, sel);
    reflection_lock(&mut out, agent, ctx);
    if let Some(report) = &ctx.sandbox {
        sandbox(&mut out, report);
    }
    recall_index(&mut out, agent, sel);
    out.findings.sort_by_key(|f| {
        (
            CHECKS
                .iter()
                .position(|c| *c == f.check)
                .unwrap_or(usize::MAX),
            f.severity,
        )
    });
    let healthy = out.findings.iter().all(|f| f.severity == Severity::Info);
    Diagnosis {
        agent: record.id.clone(),
        name: record.name.clone(),
        healthy,
        checks: CHECKS.to_vec(),
        findings: out.findings,
    }
}

/// As root, children run as agent uids, which must be able to reach the
/// home: a private directory above it (a 0700 `/root` holding
/// `~/.mini-letta`) stops every turn at its first step.
fn home_reachable(out: &mut Out, home: &Home) {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    if let Err(e) = crate::sandbox::identity::check_reachable(
        home.root(),
        "reach the home",
        "put the home elsewhere (MINI_LETTA_HOME=/var/lib/mini-letta)",
    ) {
        out.push(
            "home",
            Severity::Error,
            format!("no turn can run: {e}"),
            "move the home (MINI_LETTA_HOME=/var/lib/mini-letta/NAME, then `mini-letta agent export`/`import`) or let others traverse the directory named above (chmod o+x)".into(),
        );
    }
}

/// The audit log's disk: at its reserve, every child's action is refused
/// ([`crate::audit::reserve`]) — no spawn, no turn, no model call.
fn audit_disk(out: &mut Out, home: &Home) {
    if let Some((free, reserve)) = crate::audit::reserve::of_home(home)
        && free < reserve
    {
        out.push(
            "home",
            Severity::Error,
            format!(
                "no turn can run: the audit log's disk is down to its reserve ({free} bytes free, \
                 {reserve} kept for records of what already happened)"
            ),
            format!(
                "free space on the filesystem holding {}",
                home.audit_dir().display()
            ),
        );
    }
}

/// What a turn reads before it calls the model: `config.toml` must parse
/// (a broken one fails every turn, while `agent show` falls back to the
/// built-in default), and the agent's model must name a provider.
fn config(out: &mut Out, home: &Home, record: &AgentRecord) {
    if let Err(e) = crate::model::config::ProviderConfig::load(home) {
        out.push(
            "config",
            Severity::Error,
            format!("no turn can run: {e}"),
            format!(
                "fix or remove {} (every key is optional; README lists them)",
                home.config_file().display()
            ),
        );
        return;
    }
    if let Err(e) = crate::model::factory::parse_handle(&record.model) {
        out.push(
            "config",
            Severity::Error,
            format!(
                "the agent's model {:?} names no provider: {e}",
                record.model
            ),
            format!(
                "mini-letta agent set-model {} mock (or openai/MODEL, anthropic/MODEL)",
                record.name
            ),
        );
    }
}

fn git_status(out: &mut Out, repo: &Repository, agent: &AgentPaths, sel: &str) {
    let git_dir = agent.memory_git_dir();
    let unfinished = [
        ("MERGE_HEAD", "a merge"),
        ("rebase-merge", "a rebase"),
        ("rebase-apply", "a rebase"),
    ]
    .iter()
    .find(|(f, _)| git_dir.join(f).exists())
    .map(|(_, what)| *what);
    if let Some(what) = unfinished {
        out.push(
            "git_status",
            Severity::Error,
            format!("{what} is in progress in {}", agent.memory_dir().display()),
            format!(
                "finish it (resolve, `git add`, `GIT_EDITOR=true git rebase --continue` or \
`git commit`) or abort it, in {}",
                agent.memory_dir().display()
            ),
        );
    }
    match crate::memfs::status::worktree_status(repo) {
        Ok(s) if !s.dirty.is_empty() => {
            let shown: Vec<&str> = s.dirty.iter().take(10).map(String::as_str).collect();
            let more = s.dirty.len().saturating_sub(shown.len());
            out.push(
                "git_status",
                Severity::Warning,
                format!(
                    "{} uncommitted memory change(s): {}{}",
                    s.dirty.len(),
                    shown.join(", "),
                    if more > 0 {
                        format!(", and {more} more")
                    } else {
                        String::new()
                    }
                ),
                format!(
                    "review them with `mini-letta memory status -a {sel}`, then ask the agent to \
commit them (`mini-letta chat -a {sel} -p 'commit your memory'`: its memory tool commits them)"
                ),
            );
        }
        Ok(_) => {}
        Err(e) => out.push(
            "git_status",
            Severity::Error,
            format!("the memory checkout cannot be read: {e}"),
            "check the permissions of the agent's memory directory".into(),
        ),
    }
}

fn validator(out: &mut Out, repo: &Repository, agent: &AgentPaths, sel: &str) {
    let policy = crate::memfs::hook::read_layout_policy(&agent.memory_git_dir());
    match validate::audit_revision(repo, "HEAD", &ValidateOptions::new(policy)) {
        Ok(report) if report.is_ok() => {}
        Ok(report) => {
            let messages = report.messages();
            out.push(
                "validator",
                Severity::Error,
                format!(
                    "the committed memory fails validation: {}",
                    messages.first().copied().unwrap_or("(no message)")
                ),
                format!(
                    "fix the files named (`mini-letta memory validate -a {sel}` lists every \
violation) and commit"
                ),
            );
        }
        Err(e) => out.push(
            "validator",
            Severity::Error,
            format!("the committed memory cannot be validated: {e}"),
            "run `git fsck` in the memory repository".into(),
        ),
    }
}

/// The constraint config at `HEAD` (defaults over it, as the validator
/// applies them to a memfs-v2 tree).
fn config_at_head(repo: &Repository, tree: &validate::TreeSnapshot) -> validate::ConstraintsConfig {
    let defaults = validate::ConstraintsConfig::defaults;
    let Some(entry) = tree.get(CONFIG_PATH) else {
        return defaults();
    };
    let Ok(blob) = repo.find_blob(entry.oid) else {
        return defaults();
    };
    validate::parse_config(&String::from_utf8_lossy(blob.content()))
        .map(|c| c.over_defaults())
        .unwrap_or_else(|_| defaults())
}

fn file_size(out: &mut Out, repo: &Repository) {
    let Ok(tree) = validate::TreeSnapshot::from_revision(repo, "HEAD") else {
        return;
    };
    let config = config_at_head(repo, &tree);
    for (path, entry) in tree.iter() {
        if !path.ends_with(".md") || !entry.is_regular() {
            continue;
        }
        let (Some(limit), source) = config.limit_for(path) else {
            continue;
        };
        let Ok(blob) = repo.find_blob(entry.oid) else {
            continue;
        };
        let chars = validate::count_code_points(blob.content());
        if limit > 0 && chars * 100 > limit * NEAR_LIMIT_PERCENT {
            let pct = chars * 100 / limit;
            out.push(
                "file_size",
                if chars > limit {
                    Severity::Error
                } else {
                    Severity::Warning
                },
                format!("{path}: {chars} of {limit} characters ({pct}%, {source})"),
                format!(
                    "condense {path}, or move detail into a deferred file listed in a MEMORY.md \
index"
                ),
            );
        }
    }
}

fn index_links(out: &mut Out, repo: &Repository) {
    match crate::memfs::links::broken_index_links(repo) {
        Ok(broken) => {
            for b in broken {
                out.push(
                    "index_links",
                    Severity::Warning,
                    format!("{} links to {}, which does not exist", b.index, b.target),
                    format!(
                        "fix or remove the link in {}, or restore {}",
                        b.index, b.target
                    ),
                );
            }
        }
        Err(e) => out.push(
            "index_links",
            Severity::Warning,
            format!("the MEMORY.md indexes cannot be read: {e}"),
            "run `git fsck` in the memory repository".into(),
        ),
    }
}

fn reflection_due(out: &mut Out, agent: &AgentPaths, sel: &str) {
    let Ok(ids) = crate::store::conversation::list_ids(agent) else {
        return;
    };
    for id in ids {
        let Ok(Some(conv)) = crate::store::conversation::Conversation::open_existing(agent, &id)
        else {
            continue;
        };
        let cursor = crate::reflection::state::load(agent, &id)
            .ok()
            .and_then(|s| s.reflected_through_message_id);
        let steps = crate::reflection::state::steps_since(conv.messages(), cursor.as_deref());
        if steps > REFLECTION_OVERDUE_STEPS {
            out.push(
                "reflection_due",
                Severity::Warning,
                format!(
                    "conversation {id}: {steps} steps since its last reflection (more than \
{REFLECTION_OVERDUE_STEPS})"
                ),
                format!(
                    "`mini-letta reflect -a {sel}`, and check the trigger with `mini-letta \
reflect settings -a {sel}`"
                ),
            );
        }
    }
}

fn reflection_lock(out: &mut Out, agent: &AgentPaths, ctx: &Context) {
    match crate::reflection::lock::inspect(agent) {
        Ok(Some(info)) if info.malformed || !info.alive => out.push(
            "reflection_lock",
            Severity::Warning,
            if info.malformed {
                "reflection.lock holds no lock record".to_string()
            } else {
                format!(
                    "reflection.lock is stale: its owner (pid {}) is gone",
                    info.pid
                )
            },
            if ctx.supervisor_running {
                "the next reflection reclaims it (`mini-letta reflect`)".into()
            } else {
                "start the supervisor (`mini-letta supervisor start`): it reclaims the lock".into()
            },
        ),
        Ok(_) => {}
        Err(e) => out.push(
            "reflection_lock",
            Severity::Warning,
            format!("reflection.lock cannot be read: {e}"),
            format!("remove {}", agent.reflection_lock().display()),
        ),
    }
}

fn worktrees(out: &mut Out, repo: &Repository, agent: &AgentPaths, ctx: &Context, sel: &str) {
    let listed = crate::memfs::worktree::list(agent).unwrap_or_default();
    let admin = crate::paths::MemoryGitDir::new(&agent.memory_git_dir());
    for wt in &listed {
        let has_tree = wt.dir.exists()
            || admin
                .worktree_admin_dir(&wt.name)
                .is_some_and(|d| d.exists());
        let has_branch = repo
            .find_reference(&format!("refs/heads/{}", wt.branch))
            .is_ok();
        if has_tree {
            // A running supervisor's sub-agents own theirs; it removes
            // orphans itself when it starts.
            if !ctx.supervisor_running {
                out.push(
                    "worktrees",
                    Severity::Warning,
                    format!(
                        "orphan memory worktree {} (branch {}) with no supervisor running",
                        wt.name, wt.branch
                    ),
                    "start the supervisor (`mini-letta supervisor start`): it removes orphans \
and keeps unmerged worker branches"
                        .into(),
                );
            }
        } else if has_branch {
            out.push(
                "worktrees",
                Severity::Warning,
                format!("branch {} was kept unmerged (a conflict)", wt.branch),
                format!(
                    "a repair worker re-applies it when the supervisor next runs; or inspect it \
with `git log main..{}` and delete it when done (`mini-letta reflect status -a {sel}`)",
                    wt.branch
                ),
            );
        }
    }
}

/// Memory-worker instructions whose runs keep failing (still tried), and
/// those that failed too often (kept, no longer tried): never dropped, so
/// reported until whatever stops them is fixed.
fn failing_workers(out: &mut Out, agent: &AgentPaths, sel: &str) {
    use crate::reflection::queue;
    for item in queue::list(agent).unwrap_or_default() {
        if item.attempts < queue::FAILING_AFTER && !item.is_failed() {
            continue;
        }
        let mut said: String = item.instruction.chars().take(80).collect();
        if item.instruction.chars().nth(80).is_some() {
            said.push('…');
        }
        // The last run's two parts: what merged, how the task ended.
        let last = item
            .history
            .last()
            .map(|a| {
                format!(
                    " (last run: merge {}, task {})",
                    a.merge.as_ref().map_or("none", |m| m.status.as_str()),
                    a.task.status.as_str()
                )
            })
            .unwrap_or_default();
        if item.is_failed() {
            out.push(
                "worktrees",
                Severity::Error,
                format!(
                    "memory-worker instruction {} failed {} times and is no longer tried{last}: {said:?}",
                    item.id, item.attempts
                ),
                format!(
                    "what its runs merged is in memory and the agent was reminded; fix what stopped \
it, then have the agent delegate the same instruction again (that restarts it) or make the \
change by hand — `mini-letta reflect status -a {sel} --json` lists its runs"
                ),
            );
            continue;
        }
        out.push(
            "worktrees",
            Severity::Warning,
            format!(
                "memory-worker instruction {} has failed {} times{last}: {said:?}",
                item.id, item.attempts
            ),
            format!(
                "it is tried again, at most every two minutes while the supervisor runs, until \
it has failed {} times; fix what stops it (disk space, the model provider) — `mini-letta \
reflect status -a {sel}` shows the last run",
                queue::MAX_ATTEMPTS
            ),
        );
    }
}

fn sync_state(out: &mut Out, repo: &Repository, ctx: &Context, sel: &str) {
    let main = repo.refname_to_id("refs/heads/main").ok();
    let seen = repo
        .refname_to_id(crate::memfs::sync::REMOTE_TRACKING_REF)
        .ok();
    let backups = repo
        .references_glob(&format!("{}*", crate::memfs::sync::BACKUP_REF_PREFIX))
        .map(|r| r.count())
        .unwrap_or(0);
    match &ctx.remote_root {
        None => {
            if seen.is_some() {
                out.push(
                    "sync",
                    Severity::Info,
                    format!(
                        "memory was synced before, but {} is not set here",
                        crate::memfs::sync::REMOTE_ROOT_ENV
                    ),
                    format!("set {} to sync again", crate::memfs::sync::REMOTE_ROOT_ENV),
                );
            }
        }
        Some(root) => {
            if main.is_some() && main != seen {
                let ahead = match (main, seen) {
                    (Some(m), Some(s)) => repo.graph_ahead_behind(m, s).map(|(a, _)| a).ok(),
                    _ => None,
                };
                out.push(
                    "sync",
                    Severity::Warning,
                    match ahead {
                        Some(n) if n > 0 => format!(
                            "{n} memory commit(s) not yet on the remote {root} (as last seen)"
                        ),
                        _ => format!("local memory and the remote {root} differ (as last seen)"),
                    },
                    format!("`mini-letta sync -a {sel}`"),
                );
            }
        }
    }
    if backups > 0 {
        out.push(
            "sync",
            Severity::Info,
            format!(
                "{backups} backup ref(s) of history rewritten by sync ({}*)",
                crate::memfs::sync::BACKUP_REF_PREFIX
            ),
            "nothing to do; delete old ones with `git update-ref -d` once not needed".into(),
        );
    }
}

/// Why a sync refuses the remote, if it does (issue 36): a directory
/// remote's repository that may not be touched, or a fetched remote `main`
/// that `main` may not move to. Reads only: the path check and the
/// validator over objects already fetched.
fn remote_refused(out: &mut Out, repo: &Repository, agent: &AgentPaths, id: &str, root: &str) {
    use crate::memfs::sync::{self, SyncError};
    let home = agent
        .home()
        .map(|h| h.root().to_path_buf())
        .unwrap_or_else(|| agent.dir().to_path_buf());
    if let Err(SyncError::RootRefused(why)) = sync::agent_url(root, id, &home) {
        out.push(
            "sync",
            Severity::Error,
            format!("{why}; sync touches nothing there"),
            format!(
                "set {} to a directory, a file:// URL or an ssh, git, http or https URL",
                sync::REMOTE_ROOT_ENV
            ),
        );
        return;
    }
    if let Err(SyncError::Refused(why)) = sync::agent_url(root, id, &home) {
        out.push(
            "sync",
            Severity::Error,
            format!("{why}; sync touches nothing there"),
            "remove what was planted in the remote root: the repository must be a real bare repository (no symlinks, alternates, grafts, shallow or commondir), outside this home"
                .into(),
        );
        return;
    }
    // What a fetch would refuse for its size never arrives: ask the remote.
    if let Some(url) = sync::agent_url(root, id, &home).ok()
        && let Some(why) = crate::memfs::transport::oversized(repo, &url, "refs/heads/main")
    {
        out.push(
            "sync",
            Severity::Error,
            format!("the remote's main is refused: {why}"),
            "remove or shrink that file on the remote (a memory file is at most 1 MiB); local memory is unchanged".into(),
        );
        return;
    }
    let main = repo.refname_to_id("refs/heads/main").ok();
    let seen = repo.refname_to_id(sync::REMOTE_TRACKING_REF).ok();
    let (Some(main), Some(seen)) = (main, seen) else {
        return;
    };
    // Only a remote with something local lacks would move main.
    if main == seen || repo.graph_descendant_of(main, seen).unwrap_or(true) {
        return;
    }
    if let Ok(Some(why)) = sync::accept_from_remote(repo, seen, Some(main)) {
        let short = seen.to_string();
        out.push(
            "sync",
            Severity::Error,
            format!(
                "the remote's memory (origin/main {}) is refused, so main stays where it is: {}",
                &short[..short.len().min(12)],
                why.lines().map(str::trim).collect::<Vec<_>>().join("; ")
            ),
            format!(
                "fix the remote {root} (a commit that removes the problem, by someone who may write it), then `mini-letta sync -a {id}`; local memory is unchanged"
            ),
        );
    }
}

fn sandbox(out: &mut Out, report: &crate::sandbox::report::SandboxReport) {
    use crate::sandbox::report::Level;
    if report.level == Level::L0 {
        return;
    }
    let severity = if crate::sandbox::report::Isolation::Strict.accepts(report.level) {
        Severity::Warning
    } else {
        Severity::Error
    };
    let missing = if report.missing.is_empty() {
        String::new()
    } else {
        format!(": {}", report.missing.join("; "))
    };
    out.push(
        "sandbox",
        severity,
        format!(
            "children are confined at level {:?}, below L0{missing}",
            report.level
        ),
        "see `mini-letta sandbox status`: install bubblewrap, allow user namespaces \
(kernel.unprivileged_userns_clone, or run on the host rather than in a container), use a kernel \
with landlock"
            .into(),
    );
}

fn recall_index(out: &mut Out, agent: &AgentPaths, sel: &str) {
    let has_messages = crate::store::conversation::list_ids(agent)
        .map(|ids| {
            ids.iter().any(|id| {
                agent
                    .conversation(id)
                    .map(|c| {
                        // Never followed: the log is in a directory the agent writes.
                        std::fs::symlink_metadata(c.messages_jsonl()).is_ok_and(|m| m.len() > 0)
                    })
                    .unwrap_or(false)
            })
        })
        .unwrap_or(false);
    // The index is built and caught up lazily, by searches: missing or
    // behind is normal; entries that no longer match their log are not.
    match crate::recall::index::Index::lag(agent) {
        Ok(None) if has_messages => out.push(
            "recall_index",
            Severity::Info,
            "no recall index yet: it is built by the first search".into(),
            format!("`mini-letta recall reindex -a {sel}` builds it now"),
        ),
        Ok(Some(lag)) if !lag.stale.is_empty() => out.push(
            "recall_index",
            Severity::Warning,
            format!(
                "the recall index is stale: it covers more of {} than the log holds (truncated \
or replaced)",
                lag.stale.join(", ")
            ),
            format!("`mini-letta recall reindex -a {sel}`"),
        ),
        Ok(Some(lag)) if lag.behind_bytes > 0 => out.push(
            "recall_index",
            Severity::Info,
            format!(
                "{} bytes of conversation not indexed yet (the next search catches up)",
                lag.behind_bytes
            ),
            format!("`mini-letta recall reindex -a {sel}` indexes them now"),
        ),
        Ok(_) => {}
        Err(e) => out.push(
            "recall_index",
            Severity::Warning,
            format!("the recall index cannot be read: {e}"),
            format!("`mini-letta recall reindex -a {sel}`"),
        ),
    }
}

/// Whether a supervisor runs on `home`.
pub(crate) fn supervisor_running(home: &Home) -> bool {
    crate::supervisor::pidfile::PidFile::holder(&home.supervisor_pid_file()).is_some()
}
