//! One protocol connection on the supervisor side: reads frames (and any
//! `SCM_RIGHTS` descriptors riding on them) and writes frames through a
//! single writer task, so responses and events never interleave mid-line.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, mpsc};

use crate::protocol::{Line, LineSplitter, ServerFrame, encode};

/// Descriptors passed with a frame.
pub type PassedFds = Vec<OwnedFd>;

/// Frames waiting to be written to one peer before we stop reading its
/// requests (backpressure: its own answers must drain first).
pub const HIGH_WATER_FRAMES: usize = 256;
/// How long a peer may leave its answers unread (the queue above the high
/// water mark, nothing drained) before it is disconnected.
pub const MAX_STALL: std::time::Duration = std::time::Duration::from_secs(5);
/// Bytes waiting for one peer before it is disconnected at once (events
/// and streamed deltas are not held back by backpressure).
pub const MAX_QUEUED_BYTES: usize = 16 * 1024 * 1024;
/// Descriptors a control-socket peer may have waiting for their frame.
const MAX_PENDING_FDS: usize = 16;

/// Sends frames to the peer; cheap to clone. What waits for the peer is
/// bounded (see [`HIGH_WATER_FRAMES`], [`MAX_STALL`], [`MAX_QUEUED_BYTES`]):
/// a peer that stops reading is cut off rather than let grow the
/// supervisor's memory.
#[derive(Clone, Debug)]
pub struct FrameSender {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    link: Arc<Link>,
}

/// What the reader, the writer and every sender of one connection share.
#[derive(Debug, Default)]
struct Link {
    queued_bytes: AtomicUsize,
    queued_frames: AtomicUsize,
    /// The peer left its answers unread (as opposed to going away).
    overflowed: AtomicBool,
    cut: AtomicBool,
    cut_notify: Notify,
    /// Signalled by the writer after each frame it wrote.
    drained: Notify,
}

impl Link {
    async fn wait_cut(&self) {
        loop {
            let notified = self.cut_notify.notified();
            if self.cut.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    fn cut(&self) {
        if !self.cut.swap(true, Ordering::SeqCst) {
            self.cut_notify.notify_waiters();
            self.cut_notify.notify_one();
        }
    }

    fn overflow(&self) {
        self.overflowed.store(true, Ordering::SeqCst);
        self.cut();
    }
}

impl FrameSender {
    /// Queue a frame; false when the peer is gone or was cut off.
    pub fn send(&self, frame: &ServerFrame) -> bool {
        if self.link.cut.load(Ordering::SeqCst) {
            return false;
        }
        let bytes = encode(frame);
        let len = bytes.len();
        let queued = self.link.queued_bytes.fetch_add(len, Ordering::SeqCst) + len;
        if queued > MAX_QUEUED_BYTES {
            self.link.queued_bytes.fetch_sub(len, Ordering::SeqCst);
            self.link.overflow();
            return false;
        }
        self.link.queued_frames.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(bytes).is_err() {
            self.link.queued_bytes.fetch_sub(len, Ordering::SeqCst);
            self.link.queued_frames.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Wait until the peer's queue is below the high water mark; false (and
    /// the connection cut) when it stays above it for [`MAX_STALL`] without
    /// draining, or the connection is over.
    pub async fn room(&self) -> bool {
        let link = &self.link;
        let mut deadline = tokio::time::Instant::now() + MAX_STALL;
        loop {
            let drained = link.drained.notified();
            if link.cut.load(Ordering::SeqCst) {
                return false;
            }
            if link.queued_frames.load(Ordering::SeqCst) < HIGH_WATER_FRAMES {
                return true;
            }
            tokio::select! {
                _ = drained => {
                    // Progress: the peer reads, however slowly.
                    deadline = tokio::time::Instant::now() + MAX_STALL;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    link.overflow();
                    return false;
                }
                _ = link.wait_cut() => return false,
            }
        }
    }

    /// Whether the peer was cut off for not reading its frames.
    pub(crate) fn overflowed(&self) -> bool {
        self.link.overflowed.load(Ordering::SeqCst)
    }

    /// Resolves when the connection is over on our side (the peer did not
    /// read, or writing to it failed).
    pub(crate) async fn cut_off(&self) {
        self.link.wait_cut().await
    }
}

/// Reads frames from the peer.
pub struct FrameReader {
    read: OwnedReadHalf,
    splitter: LineSplitter,
    ready: VecDeque<(Line, PassedFds, usize)>,
    fds: PassedFds,
    /// Children may pass no descriptors: theirs are closed as they arrive
    /// and counted for the refusal of their line (here until it ends).
    accept_fds: bool,
    refused_fds: usize,
}

/// Split a stream into a reader and a sender backed by a writer task.
/// `accept_fds` is false for child channels.
pub fn split(stream: UnixStream, accept_fds: bool) -> (FrameReader, FrameSender) {
    let (read, write) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    let link = Arc::new(Link::default());
    tokio::spawn(writer(write, rx, link.clone()));
    (
        FrameReader {
            read,
            splitter: LineSplitter::new(),
            ready: VecDeque::new(),
            fds: Vec::new(),
            accept_fds,
            refused_fds: 0,
        },
        FrameSender { tx, link },
    )
}

async fn writer(
    mut write: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    link: Arc<Link>,
) {
    loop {
        let bytes = tokio::select! {
            b = rx.recv() => match b {
                Some(b) => b,
                None => break,
            },
            _ = link.wait_cut() => break,
        };
        // A write blocked on a peer that never reads ends with the cut too.
        let written = tokio::select! {
            r = write.write_all(&bytes) => r.is_ok(),
            _ = link.wait_cut() => false,
        };
        link.queued_bytes.fetch_sub(bytes.len(), Ordering::SeqCst);
        link.queued_frames.fetch_sub(1, Ordering::SeqCst);
        link.drained.notify_waiters();
        if !written {
            break;
        }
    }
    // Whatever stopped us, the connection is over: later sends fail fast.
    link.cut.store(true, Ordering::SeqCst);
    link.cut_notify.notify_waiters();
    rx.close();
    let _ = write.shutdown().await;
}

impl FrameReader {
    /// The next line, the descriptors that arrived with it and how many
    /// descriptors were refused (closed) on it; `None` at EOF.
    pub async fn next(&mut self) -> std::io::Result<Option<(Line, PassedFds, usize)>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Ok(Some(item));
            }
            let mut buf = vec![0u8; 64 * 1024];
            let (n, fds) = self.recv(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            // Closed at once: a child's descriptors never wait in our table.
            let (mut fds, refused) = if self.accept_fds {
                (fds, 0)
            } else {
                let n = fds.len();
                drop(fds);
                (Vec::new(), n)
            };
            // The kernel ends a read right after the bytes that carried
            // descriptors (it may glue earlier bytes in front of them), so
            // they belong to the line holding the chunk's last byte: the
            // last line completed here when the chunk ends a line, else
            // the line still pending.
            let chunk = &buf[..n];
            let ends_line = chunk.last() == Some(&b'\n');
            let lines = self.splitter.push(chunk);
            let count = lines.len();
            for (i, line) in lines.into_iter().enumerate() {
                let (mut line_fds, mut line_refused) = if i == 0 {
                    (
                        std::mem::take(&mut self.fds),
                        std::mem::take(&mut self.refused_fds),
                    )
                } else {
                    (Vec::new(), 0)
                };
                if ends_line && i + 1 == count {
                    line_fds.append(&mut fds);
                    line_refused += refused;
                }
                self.ready.push_back((line, line_fds, line_refused));
            }
            if !ends_line {
                self.fds.append(&mut fds);
                self.refused_fds += refused;
                // A peer sending descriptors without ever finishing a line
                // must not pile them up here.
                self.fds.truncate(MAX_PENDING_FDS);
            }
        }
    }

    async fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<(usize, PassedFds)> {
        let fd = self.read.as_ref().as_raw_fd();
        loop {
            self.read.as_ref().readable().await?;
            let res = self
                .read
                .as_ref()
                .try_io(Interest::READABLE, || recv_with_fds(fd, buf));
            match res {
                Ok(r) => return Ok(r),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

fn recv_with_fds(fd: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, PassedFds)> {
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; 8]);
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(std::io::Error::from)?;
    let mut fds = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these descriptors in our
                // table for us; nobody else owns them.
                fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
            }
        }
    }
    Ok((msg.bytes, fds))
}
