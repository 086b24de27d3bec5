//! The proxy's endpoint inside a child's network namespace, made by the
//! supervisor itself: a thread enters the namespace (`setns`), brings
//! its loopback up, binds `127.0.0.1:PORT`, and comes back. The listening
//! socket stays in that namespace but belongs to the supervisor, which
//! accepts on it like on any other: nothing in the sandbox relays, and
//! a connection on it can only come from that child (its namespace has
//! no other way in).
//!
//! One long-lived thread does this for every child, one at a time, never
//! a thread of the async runtime or the launcher (a thread left in a
//! child's namespace would put everything it does later there). Should it
//! ever fail to come back, it says so and ends; the next request starts a
//! fresh one.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::sync::mpsc;

use nix::sched::CloneFlags;
use tokio::sync::oneshot;

type Reply = oneshot::Sender<Result<std::net::TcpListener, String>>;

/// One request: the child's launcher pid, the port.
struct Job {
    pid: u32,
    port: u16,
    reply: Reply,
}

/// The thread that makes endpoints.
#[derive(Default)]
pub struct NetnsWorker {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
}

impl NetnsWorker {
    /// A listener on `127.0.0.1:port` in the network namespace of the
    /// child whose launcher is `pid` (that process or the first of its
    /// descendants in a namespace other than ours).
    pub async fn listener(&self, pid: u32, port: u16) -> Result<std::net::TcpListener, String> {
        let (reply, rx) = oneshot::channel();
        self.send(Job { pid, port, reply })?;
        rx.await
            .map_err(|_| "the namespace thread ended".to_string())?
    }

    fn send(&self, job: Job) -> Result<(), String> {
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let job = match tx.as_ref() {
            Some(t) => match t.send(job) {
                Ok(()) => return Ok(()),
                // Gone (it could not come back from a namespace): anew.
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (t, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("egress-netns".into())
            .spawn(move || work(rx))
            .map_err(|e| format!("cannot start the namespace thread: {e}"))?;
        t.send(job)
            .map_err(|_| "the namespace thread ended".to_string())?;
        *tx = Some(t);
        Ok(())
    }
}

fn work(rx: mpsc::Receiver<Job>) {
    let home = match std::fs::File::open("/proc/thread-self/ns/net") {
        Ok(f) => OwnedFd::from(f),
        Err(e) => {
            tracing::error!("egress: cannot open our own network namespace: {e}");
            return;
        }
    };
    let Ok(home_ino) = ino_of(&home) else { return };
    while let Ok(job) = rx.recv() {
        let made = make(home_ino, job.pid, job.port);
        // Back home, checked, before anything else runs on this thread.
        let back = nix::sched::setns(home.as_fd(), CloneFlags::CLONE_NEWNET).is_ok()
            && current_ino().is_ok_and(|i| i == home_ino);
        let _ = job.reply.send(made);
        if !back {
            tracing::error!(
                "egress: the namespace thread could not return to its namespace; ending it"
            );
            return;
        }
    }
}

fn ino_of(fd: &OwnedFd) -> std::io::Result<u64> {
    Ok(nix::sys::stat::fstat(fd)?.st_ino)
}

fn current_ino() -> std::io::Result<u64> {
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino())
}

/// Enter the child's namespace and make the listener there (the caller
/// returns to ours).
fn make(home_ino: u64, pid: u32, port: u16) -> Result<std::net::TcpListener, String> {
    let target = child_netns(pid, home_ino)?;
    nix::sched::setns(target.as_fd(), CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("setns into child {pid}'s network namespace: {e}"))?;
    crate::sandbox::sys::loopback_up().map_err(|e| format!("bring lo up: {e}"))?;
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("nonblocking: {e}"))?;
    Ok(listener)
}

/// The network namespace of child `pid`: its own, or that of the first
/// process of its tree in one other than ours (bubblewrap's launcher stays
/// in ours; the native stage has moved itself already).
fn child_netns(pid: u32, home_ino: u64) -> Result<OwnedFd, String> {
    for p in crate::sandbox::proc_tree::process_tree(pid) {
        let path = format!("/proc/{p}/ns/net");
        let Ok(f) = std::fs::File::open(&path) else {
            continue;
        };
        let fd = OwnedFd::from(f);
        if ino_of(&fd).is_ok_and(|i| i != home_ino) {
            return Ok(fd);
        }
    }
    Err(format!("child {pid} has no network namespace of its own"))
}
