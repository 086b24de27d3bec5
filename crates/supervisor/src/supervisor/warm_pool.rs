//! The pool of warm turn children (see `warm` for what they are and why
//! they are as safe as a cold start): one slot per agent, bounded in number
//! and idle time. Only data and its rules live here; starting, handing over
//! and sweeping are `warm`'s.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::paths::Home;
use crate::protocol::SpawnParams;

/// How many warm children a supervisor keeps at most (0: none).
pub const WARM_CHILDREN_ENV: &str = "MINI_LETTA_WARM_CHILDREN";
/// Seconds a warm child may wait unused before it is killed.
pub const WARM_IDLE_ENV: &str = "MINI_LETTA_WARM_IDLE_SECS";
const DEFAULT_LIMIT: usize = 8;
const DEFAULT_IDLE: Duration = Duration::from_secs(120);

/// What a child's confinement is planned from, besides the agent itself:
/// a warm child is used only while this is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmKey {
    isolation: String,
    workspace: Option<String>,
    /// The operator's override of the role's profile, when there is one.
    profile: Option<Vec<u8>>,
    /// The stage and agent programs on disk (device, inode, size, mtime).
    programs: Vec<(u64, u64, i64, i64, i64)>,
}

impl WarmKey {
    pub fn of(home: &Home, params: &SpawnParams) -> WarmKey {
        let programs = crate::paths::Programs::installed()
            .map(|p| {
                [p.stage, p.agent]
                    .iter()
                    .map(|path| file_identity(path))
                    .collect()
            })
            .unwrap_or_default();
        WarmKey {
            isolation: params.isolation.clone().unwrap_or_else(|| "strict".into()),
            workspace: params.workspace.clone(),
            profile: std::fs::read(home.sandbox_profile_file(&params.role)).ok(),
            programs,
        }
    }
}

fn file_identity(path: &std::path::Path) -> (u64, u64, i64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| (m.dev(), m.ino(), m.size() as i64, m.mtime(), m.mtime_nsec()))
        .unwrap_or_default()
}

/// One parked child: launched, confined, waiting on its channel (ours is
/// `channel`, not served yet).
pub struct Warm {
    pub id: u64,
    pub pid: u32,
    pub params: SpawnParams,
    pub key: WarmKey,
    pub channel: std::os::unix::net::UnixStream,
    pub since: Instant,
}

/// Kill a parked child: its channel closes and its process tree gets
/// SIGKILL (its reaper records the exit).
pub fn discard(w: Warm, why: &str) {
    tracing::debug!(child = w.id, pid = w.pid, "killing a warm child: {why}");
    drop(w.channel);
    let _ = super::child_signals::kill_child_tree(w.pid);
}

enum Slot {
    /// Being started; told when it is parked or has failed.
    Starting(watch::Receiver<bool>),
    Ready(Box<Warm>),
}

/// What an agent's slot holds for a turn.
pub enum Found {
    None,
    Ready(Box<Warm>),
    /// Being started: wait on this, then look again.
    Starting(watch::Receiver<bool>),
}

/// The supervisor's warm children, one slot per agent.
pub struct WarmPool {
    slots: Mutex<HashMap<String, Slot>>,
    limit: AtomicUsize,
    idle: Duration,
    /// The sweep runs (started with the first warm child).
    pub sweeping: AtomicBool,
}

impl Default for WarmPool {
    fn default() -> Self {
        let limit = env_number(WARM_CHILDREN_ENV).unwrap_or(DEFAULT_LIMIT as u64) as usize;
        let idle = env_number(WARM_IDLE_ENV).map_or(DEFAULT_IDLE, Duration::from_secs);
        WarmPool {
            slots: Mutex::new(HashMap::new()),
            limit: AtomicUsize::new(limit),
            idle,
            sweeping: AtomicBool::new(false),
        }
    }
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    match value.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => {
            tracing::warn!("{name}={value:?} is not a whole number; using the default");
            None
        }
    }
}

impl WarmPool {
    /// No more warm children (an embedded supervisor: it ends with its
    /// command).
    pub fn disable(&self) {
        self.limit.store(0, Ordering::Relaxed);
    }

    /// How many children are parked or being started.
    pub fn len(&self) -> usize {
        self.slots.lock().map(|s| s.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Take the agent's parked child out of its slot, or say it is coming.
    pub fn find(&self, agent: &str) -> Found {
        let Ok(mut slots) = self.slots.lock() else {
            return Found::None;
        };
        match slots.get(agent) {
            None => Found::None,
            Some(Slot::Starting(rx)) => Found::Starting(rx.clone()),
            Some(Slot::Ready(_)) => match slots.remove(agent) {
                Some(Slot::Ready(w)) => Found::Ready(w),
                _ => Found::None,
            },
        }
    }

    /// Reserve the agent's slot for a child about to be started, when it
    /// has none and the pool has room — the longest-idle child of another
    /// agent makes way (killed here). `None`: nothing to start.
    pub fn reserve(&self, agent: &str) -> Option<watch::Sender<bool>> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == 0 {
            return None;
        }
        let (tx, rx) = watch::channel(false);
        let evicted = {
            let mut slots = self.slots.lock().ok()?;
            if slots.contains_key(agent) {
                return None;
            }
            let evicted = if slots.len() >= limit {
                let oldest = slots
                    .iter()
                    .filter_map(|(a, s)| match s {
                        Slot::Ready(w) => Some((w.since, a.clone())),
                        Slot::Starting(_) => None,
                    })
                    .min()
                    .map(|(_, a)| a);
                match oldest.and_then(|a| slots.remove(&a)) {
                    Some(Slot::Ready(w)) => Some(*w),
                    _ => return None,
                }
            } else {
                None
            };
            slots.insert(agent.to_string(), Slot::Starting(rx));
            evicted
        };
        if let Some(w) = evicted {
            discard(w, "the warm pool is full");
        }
        Some(tx)
    }

    /// Put a started child in its reserved slot — unless the slot went
    /// away meanwhile (its agent was deleted, the supervisor is stopping).
    pub(crate) fn park(&self, agent: &str, warm: Option<Warm>, stopping: bool) {
        let Ok(mut slots) = self.slots.lock() else {
            if let Some(w) = warm {
                discard(w, "the pool is unusable");
            }
            return;
        };
        let reserved = matches!(slots.get(agent), Some(Slot::Starting(_)));
        match warm {
            Some(w) if reserved && !stopping => {
                slots.insert(agent.to_string(), Slot::Ready(Box::new(w)));
            }
            Some(w) => {
                drop(slots);
                discard(w, "its slot was taken away while it started");
            }
            None if reserved => {
                slots.remove(agent);
            }
            None => {}
        }
    }

    /// Take out the parked children `stale` says must go, or that waited
    /// past the idle limit.
    pub(crate) fn take_stale(&self, mut stale: impl FnMut(&str, &Warm) -> bool) -> Vec<Warm> {
        let Ok(mut slots) = self.slots.lock() else {
            return Vec::new();
        };
        let names: Vec<String> = slots
            .iter()
            .filter(|(agent, s)| match s {
                Slot::Ready(w) => w.since.elapsed() > self.idle || stale(agent, w),
                Slot::Starting(_) => false,
            })
            .map(|(a, _)| a.clone())
            .collect();
        names
            .iter()
            .filter_map(|a| match slots.remove(a) {
                Some(Slot::Ready(w)) => Some(*w),
                _ => None,
            })
            .collect()
    }

    /// Kill every warm child (the supervisor is stopping).
    pub fn drain(&self) {
        self.disable();
        let slots: Vec<Slot> = match self.slots.lock() {
            Ok(mut s) => s.drain().map(|(_, v)| v).collect(),
            Err(_) => return,
        };
        for slot in slots {
            if let Slot::Ready(w) = slot {
                discard(*w, "the supervisor is stopping");
            }
        }
    }
}
