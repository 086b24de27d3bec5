//! One protocol connection on the supervisor side: reads frames (and any
//! `SCM_RIGHTS` descriptors riding on them) and writes frames through a
//! single writer task, so responses and events never interleave mid-line.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use crate::protocol::{Line, LineSplitter, ServerFrame, encode};

/// Descriptors passed with a frame.
pub type PassedFds = Vec<OwnedFd>;

/// Sends frames to the peer; cheap to clone.
#[derive(Clone, Debug)]
pub struct FrameSender {
    tx: mpsc::UnboundedSender<Vec<u8>>,
}

impl FrameSender {
    /// Queue a frame; false when the peer is gone.
    pub fn send(&self, frame: &ServerFrame) -> bool {
        self.tx.send(encode(frame)).is_ok()
    }
}

/// Reads frames from the peer.
pub struct FrameReader {
    read: OwnedReadHalf,
    splitter: LineSplitter,
    ready: VecDeque<(Line, PassedFds)>,
    fds: PassedFds,
}

/// Split a stream into a reader and a sender backed by a writer task.
pub fn split(stream: UnixStream) -> (FrameReader, FrameSender) {
    let (read, write) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(writer(write, rx));
    (
        FrameReader {
            read,
            splitter: LineSplitter::new(),
            ready: VecDeque::new(),
            fds: Vec::new(),
        },
        FrameSender { tx },
    )
}

async fn writer(mut write: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    while let Some(bytes) = rx.recv().await {
        if write.write_all(&bytes).await.is_err() {
            break;
        }
    }
    let _ = write.shutdown().await;
}

impl FrameReader {
    /// The next line and the descriptors that arrived with it; `None` at EOF.
    pub async fn next(&mut self) -> std::io::Result<Option<(Line, PassedFds)>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Ok(Some(item));
            }
            let mut buf = vec![0u8; 64 * 1024];
            let (n, fds) = self.recv(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            // A sender attaches descriptors to the first byte of its frame,
            // and the kernel never merges bytes across that boundary into one
            // read: they belong to the first line that *starts* in this
            // chunk, which is the second completed one if an earlier frame
            // was still pending.
            let mut skip = usize::from(self.splitter.is_pending() && !fds.is_empty());
            self.fds.extend(fds);
            for line in self.splitter.push(&buf[..n]) {
                let fds = if skip > 0 {
                    skip -= 1;
                    Vec::new()
                } else {
                    std::mem::take(&mut self.fds)
                };
                self.ready.push_back((line, fds));
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
