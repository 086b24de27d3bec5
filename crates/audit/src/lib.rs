//! The tamper-evident audit log (`<home>/audit/audit.jsonl`): one JSON
//! record per line, each carrying the sha256 of the line before it, so
//! editing, removing or reordering a record breaks the chain (`audit
//! verify`), and a head saved earlier catches a cut tail.
//!
//! Only root's processes append — the supervisor (through one writer thread,
//! [`Log`]) and the operator's CLI for policy changes ([`append`]) — under
//! a `flock`, each batch made durable (`fdatasync`) before the action it
//! records is acknowledged. The directory is root's, 0700: no agent uid
//! opens anything in it.

pub mod budget;
mod chain;
mod error;
pub mod file;
pub mod kind;
pub mod publish;
pub mod read;
pub mod record;
pub mod reserve;
mod scan;
mod summary;
mod tally;
mod tracker;
pub mod verify;

use std::path::PathBuf;

use mini_letta_core::{clock, paths};

use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

pub use error::AuditError;
pub use file::{Appended, TornNote, Writer};
pub use record::Entry;

/// Records waiting for the writer thread; past this, appenders wait.
const QUEUE: usize = 1024;
/// Records one batch (one `fdatasync`) takes at most.
const BATCH: usize = 256;

struct Job {
    /// `None`: a barrier ([`Log::flush`]), answered once everything queued
    /// before it is durable.
    entry: Option<Entry>,
    done: oneshot::Sender<Result<Appended, String>>,
}

/// A queued record ([`Log::enqueue`]).
pub struct Queued(Option<oneshot::Receiver<Result<Appended, String>>>);

impl Queued {
    /// Wait until the record is durable.
    pub async fn durable(self) -> Result<Appended, AuditError> {
        let Some(wait) = self.0 else {
            return Ok(Appended {
                seq: 0,
                head: String::new(),
            });
        };
        wait.await
            .map_err(|_| AuditError::Closed)?
            .map_err(|detail| AuditError::Corrupt {
                path: PathBuf::from("audit.jsonl"),
                detail,
            })
    }
}

/// The supervisor's appender: a writer thread taking records from a
/// bounded queue and writing whatever is queued together with one sync
/// (group commit), answering each appender once its record is durable.
#[derive(Clone)]
pub struct Log {
    tx: Option<mpsc::Sender<Job>>,
    /// The log's directory (whose disk [`reserve`] watches).
    dir: PathBuf,
}

impl Log {
    /// Open the home's log, note a torn tail, append `first` (durably,
    /// before anything else can), and start the writer.
    pub fn start(
        home: &crate::paths::Home,
        first: &[Entry],
    ) -> Result<(Log, Option<TornNote>), AuditError> {
        let mut writer = Writer::open(home)?.track_usage();
        let torn = writer.recover()?;
        writer.append(first)?;
        // A summary made again from the log is on disk from the start.
        writer.save_usage();
        let (tx, mut rx) = mpsc::channel::<Job>(QUEUE);
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || {
                while let Some(first) = rx.blocking_recv() {
                    let mut jobs = vec![first];
                    while jobs.len() < BATCH {
                        match rx.try_recv() {
                            Ok(j) => jobs.push(j),
                            Err(_) => break,
                        }
                    }
                    let entries: Vec<Entry> = jobs.iter().filter_map(|j| j.entry.clone()).collect();
                    let written = if entries.is_empty() {
                        Ok(Vec::new())
                    } else {
                        writer.append(&entries)
                    };
                    // A barrier is a flush (a supervisor stopping): the
                    // usage summary is saved with it.
                    if entries.len() < jobs.len() {
                        writer.save_usage();
                    }
                    match written {
                        Ok(done) => {
                            let mut done = done.into_iter();
                            for job in jobs {
                                let answer = match job.entry {
                                    Some(_) => done.next(),
                                    None => Some(Appended {
                                        seq: 0,
                                        head: String::new(),
                                    }),
                                };
                                if let Some(a) = answer {
                                    let _ = job.done.send(Ok(a));
                                }
                            }
                        }
                        Err(e) => {
                            tracing::error!("cannot append to the audit log: {e}");
                            for job in jobs {
                                let _ = job.done.send(Err(e.to_string()));
                            }
                        }
                    }
                }
            })
            .map_err(|source| AuditError::Io {
                path: home.audit_log(),
                source,
            })?;
        Ok((
            Log {
                tx: Some(tx),
                dir: home.audit_dir(),
            },
            torn,
        ))
    }

    /// A log that records nothing (`MINI_LETTA_AUDIT=off`, for measuring
    /// what the log costs; never the default).
    pub fn off() -> Log {
        Log {
            tx: None,
            dir: PathBuf::new(),
        }
    }

    /// Refuse a record of `kind` while the disk is down to its reserve.
    fn within_reserve(&self, kind: &str) -> Result<(), AuditError> {
        reserve::check(&self.dir, kind).map_err(|(free, reserve)| AuditError::DiskReserve {
            dir: self.dir.clone(),
            free,
            reserve,
        })
    }

    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }

    /// Append `entry`; resolves once it is durable.
    pub async fn append(&self, entry: Entry) -> Result<Appended, AuditError> {
        self.enqueue(entry).await?.durable().await
    }

    /// Put `entry` in the writer's queue — after every record queued
    /// before it, ahead of every record queued after — and return; the
    /// answer says when it is durable. For what is told before it is
    /// durable (a child's exit: it has happened, nothing waits to be
    /// acknowledged).
    pub async fn enqueue(&self, entry: Entry) -> Result<Queued, AuditError> {
        let Some(tx) = &self.tx else {
            return Ok(Queued(None));
        };
        self.within_reserve(&entry.kind)?;
        let (done, wait) = oneshot::channel();
        tx.send(Job {
            entry: Some(entry),
            done,
        })
        .await
        .map_err(|_| AuditError::Closed)?;
        Ok(Queued(Some(wait)))
    }

    /// Resolve once every record queued before this call is durable. The
    /// writer is a thread the process does not wait for: a supervisor
    /// stopping (an embedded one at its command's end) calls this last, or
    /// a record only queued — a child's exit — would be lost with it.
    pub async fn flush(&self) {
        let Some(tx) = &self.tx else { return };
        let (done, wait) = oneshot::channel();
        if tx.send(Job { entry: None, done }).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// [`Log::append`] from a blocking thread (never an async worker).
    pub fn append_blocking(&self, entry: Entry) -> Result<Appended, AuditError> {
        let Some(tx) = &self.tx else {
            return Ok(Appended {
                seq: 0,
                head: String::new(),
            });
        };
        self.within_reserve(&entry.kind)?;
        let (done, wait) = oneshot::channel();
        tx.blocking_send(Job {
            entry: Some(entry),
            done,
        })
        .map_err(|_| AuditError::Closed)?;
        wait.blocking_recv()
            .map_err(|_| AuditError::Closed)?
            .map_err(|detail| AuditError::Corrupt {
                path: PathBuf::from("audit.jsonl"),
                detail,
            })
    }

    /// `append(kind, agent, role, fields)` in the supervisor: the form other
    /// parts (network egress) use to add their records.
    pub async fn record(
        &self,
        kind: &str,
        agent: Option<&str>,
        role: Option<&str>,
        fields: Map<String, Value>,
    ) -> Result<Appended, AuditError> {
        let mut entry = Entry::new(kind, agent, role);
        entry.fields = fields;
        self.append(entry).await
    }
}

/// Append one record from a process that has no [`Log`] (the operator's
/// CLI recording a policy change): opens, locks, appends, syncs, closes.
pub fn append(
    home: &crate::paths::Home,
    kind: &str,
    agent: Option<&str>,
    role: Option<&str>,
    fields: Map<String, Value>,
) -> Result<Appended, AuditError> {
    let mut entry = Entry::new(kind, agent, role);
    entry.fields = fields;
    let dir = home.audit_dir();
    reserve::check(&dir, kind).map_err(|(free, reserve)| AuditError::DiskReserve {
        dir,
        free,
        reserve,
    })?;
    let mut writer = Writer::open(home)?;
    writer.append(&[entry])?.pop().ok_or(AuditError::Closed)
}

/// The sha256 (hex) of a tool call's arguments as the child reported them.
pub fn arguments_sha256(arguments: &Value) -> String {
    record::hex(&record::line_hash(arguments.to_string().as_bytes()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Records only queued (not awaited) are durable once `flush` returns:
    /// a stopping supervisor loses none of them.
    #[test]
    fn flush_returns_once_everything_queued_before_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let home = crate::paths::Home::at(dir.path());
        std::fs::create_dir_all(home.audit_log().parent().unwrap()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let (log, _) = Log::start(&home, &[Entry::new("start", None, None)]).unwrap();
            for i in 0..300 {
                let mut e = Entry::new("exit", Some("agent-x"), Some("agent"));
                e.fields.insert("n".into(), Value::from(i));
                drop(log.enqueue(e).await.unwrap());
            }
            log.flush().await;
        });
        let text = std::fs::read_to_string(home.audit_log()).unwrap();
        assert_eq!(text.lines().count(), 301, "{} lines", text.lines().count());
        assert!(text.lines().last().unwrap().contains("\"n\":299"));
    }
}
