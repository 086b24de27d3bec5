//! What Palace shows, read without writing anything: memory from
//! `memory.git` objects (libgit2), conversations through the
//! descriptor-based readers.

use git2::{DiffFormat, DiffOptions, Oid, Repository, Sort};

use super::{MAX_DIFF_BYTES, MAX_FILE_BYTES, MAX_HISTORY, PalaceError, check_agent_id};
use crate::paths::{AgentPaths, Home};
use crate::store;
use crate::store::record::AgentRecord;

/// The home Palace looks into, and what it was started with.
#[derive(Debug, Clone)]
pub struct Site {
    pub home: Home,
    /// Only this agent, when `-a` named one.
    pub only: Option<String>,
    /// This host's confinement level, probed once.
    pub sandbox_level: String,
    /// Whether the recall search box works (served, not exported).
    pub served: bool,
    /// Commit summaries already computed (shared by clones).
    pub summaries: std::sync::Arc<SummaryCache>,
    /// Rendered history pages, by agent, with the version they show.
    pub pages: std::sync::Arc<PageCache>,
}

/// Rendered pages that depend only on what a version key names (the
/// history page: `main`'s commit and the agent's record). A request whose
/// key matches gets the same bytes without a walk; bounded by
/// [`PageCache::CAPACITY`] pages.
#[derive(Debug, Default)]
pub struct PageCache {
    map: std::sync::Mutex<std::collections::HashMap<String, (String, std::sync::Arc<String>)>>,
}

impl PageCache {
    pub const CAPACITY: usize = 256;

    /// The page `name` at version `key`, rendered by `render` when absent
    /// or stale.
    pub(crate) fn get_or_render(
        &self,
        name: &str,
        key: &str,
        render: impl FnOnce() -> Result<String, PalaceError>,
    ) -> Result<std::sync::Arc<String>, PalaceError> {
        let lock = || self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((k, page)) = lock().get(name)
            && k == key
        {
            return Ok(page.clone());
        }
        let page = std::sync::Arc::new(render()?);
        let mut map = lock();
        if map.len() >= Self::CAPACITY {
            map.clear();
        }
        map.insert(name.to_string(), (key.to_string(), page.clone()));
        Ok(page)
    }
}

/// Commit summaries (subject, author, diff stats) by commit id. A commit id
/// names its content, its parents and so its diff, so an entry never goes
/// stale; the history page then costs a walk instead of 500 diffs. Bounded:
/// at [`SummaryCache::CAPACITY`] entries it starts over.
#[derive(Debug, Default)]
pub struct SummaryCache {
    map: std::sync::Mutex<std::collections::HashMap<Oid, CommitSummary>>,
}

impl SummaryCache {
    pub const CAPACITY: usize = 20_000;

    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Oid, CommitSummary>> {
        // A panic elsewhere cannot leave an entry half written.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The summary of `oid` in `repo`, computed once.
    pub fn get(&self, repo: &Repository, oid: Oid) -> Result<CommitSummary, PalaceError> {
        if let Some(s) = self.map().get(&oid) {
            return Ok(s.clone());
        }
        let s = summary(repo, oid)?;
        let mut map = self.map();
        if map.len() >= Self::CAPACITY {
            map.clear();
        }
        map.insert(oid, s.clone());
        Ok(s)
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone)]
pub struct AgentSummary {
    pub id: String,
    pub name: String,
    pub model: String,
    pub sandbox_level: String,
    /// The newest of the last commit and the last conversation write.
    pub last_activity: Option<String>,
    /// In a cluster: the host that owns it (`-` when none, `?` when etcd
    /// did not answer); `None` without a cluster.
    pub owner: Option<String>,
}

#[derive(Debug, Clone)]
pub struct MemoryFile {
    pub path: String,
    /// `system` (compiled into the prompt), `deferred` (behind an index),
    /// `skill`, or `other`.
    pub role: &'static str,
    pub chars: u64,
    pub limit: Option<u64>,
    pub description: String,
}

#[derive(Debug, Clone)]
pub struct ConvSummary {
    pub id: String,
    pub messages: usize,
    pub last_ts: Option<String>,
}

#[derive(Debug, Clone)]
pub struct MemoryView {
    pub agent: AgentRecord,
    pub head: Option<String>,
    pub files: Vec<MemoryFile>,
    pub conversations: Vec<ConvSummary>,
    /// What the agent used, from the audit log (`None`: unreadable here).
    pub usage: Option<crate::audit::read::Usage>,
}

#[derive(Debug, Clone)]
pub struct FileView {
    pub agent: AgentRecord,
    pub path: String,
    pub commit: String,
    pub text: String,
    pub truncated: bool,
}

#[derive(Debug, Clone)]
pub struct CommitSummary {
    pub sha: String,
    pub author: String,
    pub date: String,
    pub subject: String,
    pub is_reflection: bool,
    pub files_changed: usize,
    pub insertions: usize,
    pub deletions: usize,
}

#[derive(Debug, Clone)]
pub struct HistoryView {
    pub agent: AgentRecord,
    pub commits: Vec<CommitSummary>,
    /// More commits exist than are listed.
    pub more: bool,
}

#[derive(Debug, Clone)]
pub struct CommitView {
    pub agent: AgentRecord,
    pub summary: CommitSummary,
    pub message: String,
    pub parents: Vec<String>,
    /// Paths the commit changed (with `A`/`M`/`D`/`R` status).
    pub changed: Vec<(char, String)>,
    pub diff: String,
    pub diff_truncated: bool,
}

#[derive(Debug, Clone)]
pub struct MessageView {
    pub id: String,
    pub role: String,
    pub kind: Option<String>,
    pub ts: String,
    pub text: String,
    pub evicted: bool,
}

#[derive(Debug, Clone)]
pub struct ConversationView {
    pub agent: AgentRecord,
    pub id: String,
    pub messages: Vec<MessageView>,
    pub system_prompt: Option<crate::store::system_prompt_file::CachedPrompt>,
    pub tokens: Option<u64>,
    pub threshold: Option<u64>,
    pub window: Option<u64>,
    pub compactions: usize,
    pub last_compaction: Option<crate::reports::CompactionEvent>,
    pub steps_since_reflection: u64,
    pub reflected_through: Option<String>,
    pub last_reflection: Option<String>,
    pub lock: Option<crate::reflection::lock::LockInfo>,
    pub backoff: Option<crate::reflection::backoff::Backoff>,
    /// The last reflection's and the last memory worker's outcomes.
    pub last_reflection_outcome: Option<SubagentOutcome>,
    pub last_worker_outcome: Option<SubagentOutcome>,
    /// Memory-worker instructions that failed too often (kept, not run).
    pub failed_workers: Vec<FailedWorker>,
}

/// A sub-agent run's two parts, as Palace shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubagentOutcome {
    /// What merged (`merged`, `no_changes`, `merge_conflict`, …).
    pub merge: String,
    /// How the task ended (`finished`, `failed`, `killed`, …; `-` in a
    /// record older than the split).
    pub task: String,
    pub finished_at: String,
    pub summary: String,
    /// A worker's run number.
    pub attempt: Option<u64>,
}

impl SubagentOutcome {
    /// From a result record (`reflections/last-result.json`,
    /// `last-worker.json`).
    fn from_record(r: &crate::protocol::replies::SubagentResult) -> Self {
        SubagentOutcome {
            merge: r.merge_status().to_string(),
            task: r
                .task
                .as_ref()
                .map_or("-", |t| t.status.as_str())
                .to_string(),
            finished_at: r.finished_at.clone().unwrap_or_else(|| "-".into()),
            summary: r.summary.clone(),
            attempt: r.attempt.map(u64::from),
        }
    }
}

/// A memory-worker instruction kept, marked failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedWorker {
    pub id: String,
    pub instruction: String,
    pub attempts: u32,
}

fn failed_workers(paths: &AgentPaths) -> Vec<FailedWorker> {
    crate::reflection::queue::list(paths)
        .unwrap_or_default()
        .into_iter()
        .filter(|i| i.is_failed())
        .map(|i| FailedWorker {
            id: i.id,
            instruction: crate::reflection::truncate_chars(&i.instruction, 300),
            attempts: i.attempts,
        })
        .collect()
}

/// Who owns which agent, when a cluster is configured (read from etcd,
/// bounded: a page never waits long for it).
fn cluster_owners(
    home: &Home,
) -> Option<Result<crate::cluster::status::Status, crate::cluster::ClusterError>> {
    let cfg = crate::cluster::ClusterConfig::load(home).ok()??;
    Some(crate::cluster::status::read_blocking(&cfg))
}

fn internal(e: impl std::fmt::Display) -> PalaceError {
    PalaceError::Internal(e.to_string())
}

impl Site {
    pub fn new(home: Home, only: Option<String>, served: bool) -> Self {
        let level = crate::sandbox::report::SandboxReport::probe().level;
        Self {
            home,
            only,
            sandbox_level: format!("{level:?}"),
            served,
            summaries: Default::default(),
            pages: Default::default(),
        }
    }

    /// What the history page of agent `id` shows depends on: `main`'s
    /// commit and the record (its name and model are on the page).
    pub(crate) fn history_version(&self, id: &str) -> Result<String, PalaceError> {
        let (agent, paths) = self.agent(id)?;
        let head = head(&open(&paths)?)
            .map(|h| h.to_string())
            .unwrap_or_default();
        Ok(format!("{head}\0{}\0{}", agent.name, agent.model))
    }

    /// The agents shown (all, or the one `-a` named).
    pub fn agents(&self) -> Result<Vec<AgentSummary>, PalaceError> {
        let listing = store::list_all(&self.home).map_err(internal)?;
        let owners = cluster_owners(&self.home);
        let mut out = Vec::new();
        for r in listing.agents {
            if self.only.as_deref().is_some_and(|o| o != r.id) {
                continue;
            }
            let paths = self.home.agent(&r.id).map_err(internal)?;
            out.push(AgentSummary {
                last_activity: last_activity(&paths),
                owner: owners.as_ref().map(|o| match o {
                    Ok(status) => status.owner_of(&r.id).unwrap_or("-").to_string(),
                    Err(_) => "?".to_string(),
                }),
                id: r.id,
                name: r.name,
                model: r.model,
                sandbox_level: self.sandbox_level.clone(),
            });
        }
        Ok(out)
    }

    /// The record and paths of agent `id`, which the request named.
    pub fn agent(&self, id: &str) -> Result<(AgentRecord, AgentPaths), PalaceError> {
        check_agent_id(&self.home, id)?;
        if self.only.as_deref().is_some_and(|o| o != id) {
            return Err(PalaceError::NotFound(format!("no agent {id} here")));
        }
        let paths = self.home.agent(id).map_err(internal)?;
        let record = store::load(&paths).map_err(internal)?;
        Ok((record, paths))
    }

    pub fn memory(&self, id: &str) -> Result<MemoryView, PalaceError> {
        let (agent, paths) = self.agent(id)?;
        let repo = open(&paths)?;
        let head = head(&repo);
        let mut files = Vec::new();
        if let Some(h) = head {
            let tree = repo.find_commit(h)?.tree()?;
            let snapshot =
                crate::memfs::validate::TreeSnapshot::from_tree(&repo, &tree).map_err(internal)?;
            let config = config_of(&repo, &snapshot);
            for (path, entry) in snapshot.iter() {
                if !entry.is_blob() {
                    continue;
                }
                let Ok(blob) = repo.find_blob(entry.oid) else {
                    continue;
                };
                let text = String::from_utf8_lossy(blob.content());
                let role = if path.starts_with("skills/") {
                    "skill"
                } else if !path.ends_with(".md") {
                    "other"
                } else if path.contains('/') {
                    "deferred"
                } else {
                    "system"
                };
                let description = if path.ends_with(".md") {
                    crate::memfs::frontmatter::parse_frontmatter(&text)
                        .description()
                        .to_string()
                } else {
                    String::new()
                };
                files.push(MemoryFile {
                    path: path.to_string(),
                    role,
                    chars: crate::memfs::validate::count_code_points(blob.content()),
                    limit: if path.ends_with(".md") {
                        config.limit_for(path).0
                    } else {
                        None
                    },
                    description,
                });
            }
        }
        let filter = crate::audit::read::Filter {
            agent: Some(agent.id.clone()),
            ..Default::default()
        };
        let usage = crate::audit::read::usage(&self.home, &filter)
            .ok()
            .map(|mut u| u.remove(&agent.id).unwrap_or_default());
        Ok(MemoryView {
            usage,
            conversations: conversations(&paths),
            agent,
            head: head.map(|h| h.to_string()),
            files,
        })
    }

    /// `path` at commit `sha` (`HEAD` when `None`).
    pub fn file(&self, id: &str, path: &str, sha: Option<Oid>) -> Result<FileView, PalaceError> {
        super::check_memory_path(path)?;
        let (agent, paths) = self.agent(id)?;
        let repo = open(&paths)?;
        let commit = match sha {
            Some(s) => repo
                .find_commit(s)
                .map_err(|_| PalaceError::NotFound(format!("no commit {s}")))?,
            None => repo.find_commit(
                head(&repo).ok_or_else(|| PalaceError::NotFound("no commits".into()))?,
            )?,
        };
        let entry = commit
            .tree()?
            .get_path(std::path::Path::new(path))
            .map_err(|_| PalaceError::NotFound(format!("{path} is not in {}", commit.id())))?;
        // Only regular files: a symlink in the tree names a path, which is
        // never followed; a directory is not a file.
        let mode = entry.filemode();
        if entry.kind() != Some(git2::ObjectType::Blob) || mode == 0o120000 {
            return Err(PalaceError::NotFound(format!(
                "{path} is not a regular file"
            )));
        }
        let blob = repo.find_blob(entry.id())?;
        let bytes = blob.content();
        let truncated = bytes.len() > MAX_FILE_BYTES;
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_FILE_BYTES)]).into_owned();
        Ok(FileView {
            agent,
            path: path.to_string(),
            commit: commit.id().to_string(),
            text,
            truncated,
        })
    }

    pub fn history(&self, id: &str) -> Result<HistoryView, PalaceError> {
        let (agent, paths) = self.agent(id)?;
        let repo = open(&paths)?;
        let mut commits = Vec::new();
        let mut more = false;
        if let Some(h) = head(&repo) {
            let mut walk = repo.revwalk()?;
            walk.set_sorting(Sort::TOPOLOGICAL | Sort::TIME)?;
            walk.push(h)?;
            for (n, oid) in walk.enumerate() {
                if n >= MAX_HISTORY {
                    more = true;
                    break;
                }
                commits.push(self.summaries.get(&repo, oid?)?);
            }
        }
        Ok(HistoryView {
            agent,
            commits,
            more,
        })
    }

    pub fn commit(&self, id: &str, sha: Oid) -> Result<CommitView, PalaceError> {
        let (agent, paths) = self.agent(id)?;
        let repo = open(&paths)?;
        let commit = repo
            .find_commit(sha)
            .map_err(|_| PalaceError::NotFound(format!("no commit {sha}")))?;
        let summary = self.summaries.get(&repo, sha)?;
        let diff = diff_of(&repo, &commit)?;
        let mut changed = Vec::new();
        for d in diff.deltas() {
            let status = match d.status() {
                git2::Delta::Added => 'A',
                git2::Delta::Deleted => 'D',
                git2::Delta::Renamed => 'R',
                _ => 'M',
            };
            let p = d
                .new_file()
                .path()
                .or_else(|| d.old_file().path())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            changed.push((status, p));
        }
        let mut text = Vec::new();
        let mut truncated = false;
        diff.print(DiffFormat::Patch, |_, _, line| {
            if text.len() >= MAX_DIFF_BYTES {
                truncated = true;
                return false;
            }
            if matches!(line.origin(), '+' | '-' | ' ') {
                text.push(line.origin() as u8);
            }
            text.extend_from_slice(line.content());
            true
        })
        .or_else(|e| if truncated { Ok(()) } else { Err(e) })?;
        Ok(CommitView {
            agent,
            message: String::from_utf8_lossy(commit.message_bytes()).into_owned(),
            parents: commit.parent_ids().map(|p| p.to_string()).collect(),
            summary,
            changed,
            diff: String::from_utf8_lossy(&text).into_owned(),
            diff_truncated: truncated,
        })
    }

    pub fn conversation(&self, id: &str, conv: &str) -> Result<ConversationView, PalaceError> {
        let (agent, paths) = self.agent(id)?;
        let bad = |e: &dyn std::fmt::Display| PalaceError::BadRequest(e.to_string());
        paths.conversation(conv).map_err(|e| bad(&e))?;
        let c = crate::store::conversation::Conversation::open_existing(&paths, conv)
            .map_err(internal)?
            .ok_or_else(|| PalaceError::NotFound(format!("no conversation {conv}")))?;
        let in_context: std::collections::HashSet<String> =
            c.context_ids().unwrap_or_default().into_iter().collect();
        let messages = c
            .messages()
            .iter()
            .map(|m| MessageView {
                id: m.id.clone(),
                role: format!("{:?}", m.role).to_lowercase(),
                kind: m.kind.clone(),
                ts: m.ts.clone(),
                text: m.text(),
                evicted: !in_context.contains(&m.id),
            })
            .collect();
        let state = crate::reflection::state::load(&paths, conv).unwrap_or_default();
        let steps = crate::reflection::state::steps_since(
            c.messages(),
            state.reflected_through_message_id.as_deref(),
        );
        let context = crate::reports::context_report(&self.home, &agent, &paths, conv).ok();
        Ok(ConversationView {
            id: conv.to_string(),
            messages,
            system_prompt: crate::store::system_prompt_file::load(&paths, conv)
                .ok()
                .flatten(),
            tokens: context.as_ref().map(|r| r.tokens),
            threshold: context.as_ref().and_then(|r| r.window.threshold),
            window: context.as_ref().and_then(|r| r.window.context_window),
            compactions: context.as_ref().map_or(0, |r| r.compactions),
            last_compaction: context.and_then(|r| r.last_compaction),
            steps_since_reflection: steps,
            reflected_through: state.reflected_through_message_id.clone(),
            last_reflection: state.last_succeeded_at.clone(),
            lock: crate::reflection::lock::inspect(&paths).ok().flatten(),
            backoff: crate::reflection::backoff::load(&paths).ok().flatten(),
            last_reflection_outcome: crate::reflection::launch_result::load_last_result(&paths)
                .ok()
                .flatten()
                .map(|r| SubagentOutcome::from_record(&r)),
            last_worker_outcome: crate::reflection::launch_result::load_last_worker_result(&paths)
                .ok()
                .flatten()
                .map(|r| SubagentOutcome::from_record(&r)),
            failed_workers: failed_workers(&paths),
            agent,
        })
    }

    /// Recall search (served mode), read-only.
    pub fn search(
        &self,
        id: &str,
        query: &str,
    ) -> Result<(AgentRecord, Vec<crate::recall::search::Hit>), PalaceError> {
        let (agent, paths) = self.agent(id)?;
        if query.trim().is_empty() {
            return Ok((agent, Vec::new()));
        }
        if query.len() > 500 {
            return Err(PalaceError::BadRequest("the query is too long".into()));
        }
        let filters = crate::recall::search::Filters::default();
        let hits = crate::recall::search::search_read_only(&paths, query, &filters, 20)
            .map_err(|e| PalaceError::BadRequest(e.to_string()))?;
        Ok((agent, hits))
    }
}

/// `memory.git`, opened bare: objects and refs only.
fn open(paths: &AgentPaths) -> Result<Repository, PalaceError> {
    crate::memfs::repo::open_bare(&paths.memory_git_dir())
        .map_err(|e| PalaceError::Internal(format!("cannot open the memory repository: {e}")))
}

fn head(repo: &Repository) -> Option<Oid> {
    repo.refname_to_id("refs/heads/main").ok()
}

fn config_of(
    repo: &Repository,
    tree: &crate::memfs::validate::TreeSnapshot,
) -> crate::memfs::validate::ConstraintsConfig {
    use crate::memfs::validate::{CONFIG_PATH, ConstraintsConfig, parse_config};
    tree.get(CONFIG_PATH)
        .and_then(|e| repo.find_blob(e.oid).ok())
        .and_then(|b| parse_config(&String::from_utf8_lossy(b.content())).ok())
        .map(|c| c.over_defaults())
        .unwrap_or_else(ConstraintsConfig::defaults)
}

fn diff_of<'r>(
    repo: &'r Repository,
    commit: &git2::Commit<'_>,
) -> Result<git2::Diff<'r>, PalaceError> {
    let tree = commit.tree()?;
    let parent = match commit.parent(0) {
        Ok(p) => Some(p.tree()?),
        Err(_) => None,
    };
    let mut opts = DiffOptions::new();
    opts.context_lines(3);
    let mut diff = repo.diff_tree_to_tree(parent.as_ref(), Some(&tree), Some(&mut opts))?;
    diff.find_similar(None)?;
    Ok(diff)
}

fn summary(repo: &Repository, oid: Oid) -> Result<CommitSummary, PalaceError> {
    let c = repo.find_commit(oid)?;
    let subject = c.summary().ok().flatten().unwrap_or("").to_string();
    let stats = diff_of(repo, &c).and_then(|d| Ok(d.stats()?));
    let (files_changed, insertions, deletions) = match stats {
        Ok(s) => (s.files_changed(), s.insertions(), s.deletions()),
        Err(_) => (0, 0, 0),
    };
    Ok(CommitSummary {
        sha: oid.to_string(),
        author: c.author().name().unwrap_or("?").to_string(),
        date: time::OffsetDateTime::from_unix_timestamp(c.time().seconds())
            .ok()
            .map(crate::clock::rfc3339)
            .unwrap_or_default(),
        is_reflection: subject.starts_with("merge(reflection)")
            || subject.starts_with("merge(memory-worker)"),
        subject,
        files_changed,
        insertions,
        deletions,
    })
}

fn conversations(paths: &AgentPaths) -> Vec<ConvSummary> {
    let ids = crate::store::conversation::list_ids(paths).unwrap_or_default();
    ids.into_iter()
        .filter_map(|id| {
            // Counted while streamed: no conversation is held whole.
            let c = crate::store::conversation::summary(paths, &id)
                .ok()
                .flatten()?;
            for w in c.report.warnings() {
                tracing::warn!("palace: conversation {id}: {w}");
            }
            Some(ConvSummary {
                messages: c.messages,
                last_ts: c.last_ts,
                id,
            })
        })
        .collect()
}

fn last_activity(paths: &AgentPaths) -> Option<String> {
    let commit_time = open(paths).ok().and_then(|repo| {
        let h = head(&repo)?;
        repo.find_commit(h).ok().map(|c| c.time().seconds())
    });
    let log_time = crate::store::conversation::list_ids(paths)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|id| {
            let log = paths.conversation(&id).ok()?.messages_jsonl();
            // Never followed: a symlink's own time, at most.
            let m = std::fs::symlink_metadata(log).ok()?;
            m.modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()
        })
        .map(|d| d.as_secs() as i64)
        .max();
    let newest = commit_time.into_iter().chain(log_time).max()?;
    time::OffsetDateTime::from_unix_timestamp(newest)
        .ok()
        .map(crate::clock::rfc3339)
}
