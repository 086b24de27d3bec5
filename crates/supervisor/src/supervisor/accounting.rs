//! The supervisor's side of the audit log: one record per action on an
//! agent (spawn, exit, tool, commit, merge, sync, model call, refusal),
//! appended before the action is acknowledged; usage figures of children;
//! and the token-budget check before each model call.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;

use crate::audit::budget::{self, Refusal, Spent};
use crate::audit::{AuditError, Entry, Log, kind};
use crate::paths::Home;

/// Tool calls a child reported and has not yet reported a result for,
/// across all children; past this the oldest are forgotten.
const MAX_OPEN_TOOL_CALLS: usize = 4096;

/// A reported tool call: when, the tool, the sha256 of its arguments.
type OpenCall = (Instant, String, String);

/// What the supervisor keeps for the log.
pub struct Accounting {
    pub log: Log,
    /// Tokens spent per agent and day, read from the log on the first
    /// budget check (then kept current).
    spent: Mutex<Option<Spent>>,
    /// (child, call id) → when the call was reported, tool name, sha256 of
    /// its arguments.
    tools: Mutex<HashMap<(u64, String), OpenCall>>,
    /// Live children's cgroups (`ps` reads their figures).
    groups: Mutex<HashMap<u64, Vec<PathBuf>>>,
    /// Tokens reserved per agent by its model calls under way (taken with
    /// `spent` held, so a check and its reservation are one step).
    reserved: Mutex<HashMap<String, u64>>,
}

/// Tokens a model call holds against its agent's budget until it is
/// settled ([`Accounting::model_called`] adds what it spent); given back
/// when dropped.
pub struct Reservation<'a> {
    accounting: &'a Accounting,
    agent: Option<String>,
    tokens: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let Some(agent) = self.agent.take() else {
            return;
        };
        let mut reserved = self
            .accounting
            .reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(r) = reserved.get_mut(&agent) {
            *r = r.saturating_sub(self.tokens);
            if *r == 0 {
                reserved.remove(&agent);
            }
        }
    }
}

impl Accounting {
    /// Open the home's log (`MINI_LETTA_AUDIT=off` turns it off, for
    /// measuring its cost only) and record this supervisor's start.
    pub fn start(home: &Home) -> Result<Accounting, AuditError> {
        let log = if std::env::var("MINI_LETTA_AUDIT").as_deref() == Ok("off") {
            tracing::warn!(
                "AUDIT LOG OFF (MINI_LETTA_AUDIT=off): nothing this supervisor does is recorded"
            );
            Log::off()
        } else {
            // The head found, published before anything of this run is
            // written; a bad `[audit]` table stops the start (the operator
            // asked for an anchor).
            crate::audit::publish::publish_if_moved(home, None)?;
            let started = Entry::new(kind::START, None, Some("supervisor"))
                .with("pid", std::process::id())
                .with("version", env!("CARGO_PKG_VERSION"));
            let (log, torn) = Log::start(home, &[started])?;
            if let Some(t) = torn {
                tracing::warn!(
                    after_seq = t.after_seq,
                    bytes = t.bytes,
                    noted_by = t.noted_by,
                    "the audit log ended in a torn line (a crash while appending): kept, and noted by a torn record"
                );
            }
            log
        };
        Ok(Accounting::with_log(log))
    }

    pub fn with_log(log: Log) -> Accounting {
        Accounting {
            log,
            spent: Mutex::new(None),
            tools: Mutex::new(HashMap::new()),
            groups: Mutex::new(HashMap::new()),
            reserved: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `agent` may make a model call now, and if so `reserve`
    /// tokens for it (an upper bound of what it can spend) until the
    /// reservation is dropped: a call starts only while the agent's spent
    /// and reserved tokens are below its budget, so of calls made at once
    /// at most one can cross it. A refusal is recorded (`budget`) before it
    /// is returned. Blocking (it may read the log).
    pub(crate) fn check_budget(
        &self,
        home: &Home,
        agent: &str,
        role: &str,
        at: &str,
        reserve: u64,
    ) -> Result<Reservation<'_>, Refusal> {
        let none = Reservation {
            accounting: self,
            agent: None,
            tokens: 0,
        };
        if !self.log.is_on() {
            return Ok(none);
        }
        let budgets = match budget::load(home) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("cannot read the token budgets: {e}");
                return Err(refusal_unreadable(&e));
            }
        };
        let Some(b) = budgets.get(agent).copied() else {
            return Ok(none);
        };
        let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        if spent.is_none() {
            match Spent::read(home) {
                Ok(s) => *spent = Some(s),
                Err(e) => return Err(refusal_unreadable(&e)),
            }
        }
        let name = crate::store::find(home, Some(agent))
            .map(|(r, _)| r.name)
            .unwrap_or_else(|_| agent.to_string());
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        let in_flight = reserved.get(agent).copied().unwrap_or(0);
        let refused = spent.as_ref().and_then(|s| {
            budget::check(
                Some(b),
                s,
                agent,
                &name,
                time::OffsetDateTime::now_utc(),
                in_flight,
            )
        });
        if refused.is_none() {
            *reserved.entry(agent.to_string()).or_default() += reserve;
        }
        drop(reserved);
        drop(spent);
        let Some(r) = refused else {
            return Ok(Reservation {
                accounting: self,
                agent: Some(agent.to_string()),
                tokens: reserve,
            });
        };
        let entry = Entry::new(kind::BUDGET, Some(agent), Some(role))
            .with("at", at)
            .with("budget", r.budget)
            .with("period", r.period.as_str())
            .with("used", r.used)
            .with("resets", r.resets.clone())
            .with("message", r.message.clone());
        if let Err(e) = self.log.append_blocking(entry) {
            tracing::error!("cannot record a budget refusal: {e}");
        }
        Err(r)
    }

    /// Record one provider call (before its answer goes back); tokens
    /// count against the agent's budget from here on. Blocking.
    pub(crate) fn model_called(
        &self,
        agent: Option<&str>,
        role: &str,
        model: &str,
        purpose: &str,
        outcome: Result<&crate::model::Usage, &str>,
        took_ms: u64,
    ) -> Result<(), AuditError> {
        let mut entry = Entry::new(kind::MODEL, agent, Some(role))
            .with("model", model)
            .with("purpose", purpose)
            .with("duration_ms", took_ms);
        let tokens = match outcome {
            Ok(u) => {
                entry = entry
                    .with("input_tokens", u.input_tokens)
                    .with("output_tokens", u.output_tokens)
                    .with("outcome", "ok");
                u.input_tokens + u.output_tokens
            }
            Err(message) => {
                entry = entry
                    .with("input_tokens", 0)
                    .with("output_tokens", 0)
                    .with("outcome", "error")
                    .with("error", message);
                0
            }
        };
        let time = crate::audit::record::now();
        let appended = self.log.append_blocking(entry)?;
        if let (Some(a), Some(s)) = (
            agent,
            self.spent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut(),
        ) {
            s.add(appended.seq, a, &time, tokens);
        }
        Ok(())
    }

    /// A child reported a turn event: a tool call's start or its result
    /// (a `tool` record, marked as the child's report).
    pub async fn turn_event(
        &self,
        id: &u64,
        agent: &str,
        role: &str,
        event: &Value,
    ) -> Result<(), AuditError> {
        let call_id = event["id"].as_str().unwrap_or_default().to_string();
        match event["type"].as_str() {
            Some("tool_call") => {
                let name = event["name"].as_str().unwrap_or_default().to_string();
                let args = crate::audit::arguments_sha256(&event["arguments"]);
                let mut tools = self.tools.lock().unwrap_or_else(|p| p.into_inner());
                if tools.len() >= MAX_OPEN_TOOL_CALLS
                    && let Some(oldest) = tools
                        .iter()
                        .min_by_key(|(_, v)| v.0)
                        .map(|(k, _)| k.clone())
                {
                    tools.remove(&oldest);
                }
                tools.insert((*id, call_id), (Instant::now(), name, args));
                Ok(())
            }
            Some("tool_result") => {
                let open = self
                    .tools
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&(*id, call_id.clone()));
                let (took, args) = match &open {
                    Some((t, _, a)) => (Some(t.elapsed().as_millis() as u64), Some(a.clone())),
                    None => (None, None),
                };
                let is_error = event["is_error"].as_bool().unwrap_or(false);
                let entry = Entry::new(kind::TOOL, Some(agent), Some(role))
                    .with("child", *id)
                    .with("tool", event["name"].as_str().unwrap_or_default())
                    .with("call_id", call_id)
                    .with("args_sha256", args)
                    .with("exit_status", if is_error { 1 } else { 0 })
                    .with("duration_ms", took)
                    .with("reported_by", "child");
                self.log.append(entry).await.map(drop)
            }
            _ => Ok(()),
        }
    }

    /// Remember a live child's groups (for `ps`).
    pub(crate) fn track(&self, child: u64, groups: Vec<PathBuf>) {
        if !groups.is_empty() {
            self.groups
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(child, groups);
        }
    }

    /// A live child's current figures for `ps --json`: CPU ms and memory
    /// bytes (its groups, else its process tree from `/proc`).
    pub(crate) fn live_figures(
        &self,
        child: u64,
        pid: u32,
    ) -> crate::protocol::replies::LiveFigures {
        let groups = self
            .groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&child)
            .cloned()
            .unwrap_or_default();
        let g = crate::sandbox::cgroup::usage(&groups);
        let (tree_cpu_us, tree_rss) = tree_usage(pid);
        crate::protocol::replies::LiveFigures {
            cpu_ms: g.cpu_us.unwrap_or(0).max(tree_cpu_us).div_ceil(1000),
            memory_bytes: g.memory_bytes.unwrap_or(0).max(tree_rss),
            peak_memory_bytes: g.peak_memory_bytes,
        }
    }

    /// Forget an ended child; its groups' last figures.
    pub(crate) fn untrack(&self, child: u64) -> crate::sandbox::cgroup::GroupUsage {
        let groups = self
            .groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&child);
        self.tools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(c, _), _| *c != child);
        groups
            .map(|g| crate::sandbox::cgroup::usage(&g))
            .unwrap_or_default()
    }
}

fn refusal_unreadable(e: &AuditError) -> Refusal {
    Refusal {
        budget: 0,
        period: budget::Period::Total,
        used: 0,
        resets: None,
        message: format!(
            "cannot check the token budget ({e}): no model call is made until it can be"
        ),
    }
}

/// CPU µs (user + system, with reaped children) and resident bytes of
/// `pid`'s live process tree, from `/proc`.
fn tree_usage(pid: u32) -> (u64, u64) {
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100)
        .max(1) as u64;
    let page = 4096u64;
    let mut cpu_ticks = 0u64;
    let mut rss = 0u64;
    for p in crate::sandbox::proc_tree::process_tree(pid) {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // Fields after the command's closing parenthesis: 14–17 are
        // utime, stime, cutime, cstime; 24 is rss (pages).
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        cpu_ticks += f.get(11..15).map_or(0, |t| t.iter().sum());
        rss += f.get(21).copied().unwrap_or(0) * page;
    }
    (cpu_ticks * 1_000_000 / tick, rss)
}

/// Wait for child `pid` to exit (without reaping it) and read what it
/// used; `None` when that cannot be known.
pub(crate) async fn exit_usage(pid: u32) -> Option<(u64, u64)> {
    use std::os::fd::AsFd;
    let pidfd = crate::sandbox::sys::pidfd_open(pid).ok()?;
    // SAFETY: an OwnedFd keeps its descriptor open and unchanged for as
    // long as the AsyncFd owns it.
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    }
    .ok()?;
    loop {
        let mut ready = fd.readable().await.ok()?;
        match crate::sandbox::sys::exited_usage(fd.get_ref().as_fd()) {
            Ok(Some(u)) => return Some(u),
            Ok(None) => ready.clear_ready(),
            Err(_) => return None,
        }
    }
}
