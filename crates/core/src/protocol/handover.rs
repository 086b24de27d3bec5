//! The one message a warm turn child gets before anything else on its
//! channel: which conversation its turn is, and the caller's three stdio
//! descriptors (`SCM_RIGHTS`).
//!
//! A warm child is started, confined and exec'd ahead of its turn; it
//! waits on its channel for this. Its shape is fixed, not a JSON line: a
//! 4-byte big-endian length (the descriptors ride on these bytes), then
//! that many bytes of JSON — so the child reads exactly this message and
//! leaves the protocol's frames that follow to its client.

use std::io::{IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

/// What the supervisor decided for this turn; the child cannot choose it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    /// The conversation the turn runs (the input on stdin must name it).
    pub conversation: String,
    /// The turn asked for its marks (`chat --timings`).
    #[serde(default)]
    pub timings: bool,
}

/// The largest handover body read (a conversation id is short).
const MAX_BODY: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("the supervisor closed the channel before handing over a turn")]
    Closed,
    #[error("channel: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid handover: {0}")]
    Invalid(String),
}

/// Send the handover on the supervisor's end of a warm child's channel.
pub fn send(sock: BorrowedFd<'_>, h: &Handover, stdio: [BorrowedFd<'_>; 3]) -> std::io::Result<()> {
    let body = serde_json::to_vec(h).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(std::io::Error::other)?;
    let mut message = len.to_be_bytes().to_vec();
    message.extend_from_slice(&body);
    let fds: [RawFd; 3] = stdio.map(|f| f.as_raw_fd());
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let mut sent = sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(&message)],
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)?;
    // The channel is empty when a turn is handed over, so one send takes
    // it all; a short send is finished without the descriptors.
    while sent < message.len() {
        let n = nix::sys::socket::send(sock.as_raw_fd(), &message[sent..], MsgFlags::MSG_NOSIGNAL)
            .map_err(std::io::Error::from)?;
        sent += n;
    }
    Ok(())
}

/// Wait for the handover on the child's end of its channel: the turn and
/// the three descriptors, exactly this message read.
pub fn receive(sock: BorrowedFd<'_>) -> Result<(Handover, [OwnedFd; 3]), HandoverError> {
    let mut head = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 3]);
    let (got, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut head)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for c in msg.cmsgs().map_err(std::io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: SCM_RIGHTS just installed these in this
                        // process; nothing else owns them.
                        fds.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                break (msg.bytes, fds);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    };
    if got == 0 {
        return Err(HandoverError::Closed);
    }
    let mut stream = std::os::unix::net::UnixStream::from(sock.try_clone_to_owned()?);
    if got < head.len() {
        stream.read_exact(&mut head[got..]).map_err(eof_is_closed)?;
    }
    let len = u32::from_be_bytes(head) as usize;
    if len > MAX_BODY {
        return Err(HandoverError::Invalid(format!(
            "{len} bytes (at most {MAX_BODY})"
        )));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).map_err(eof_is_closed)?;
    let h: Handover =
        serde_json::from_slice(&body).map_err(|e| HandoverError::Invalid(e.to_string()))?;
    let stdio: [OwnedFd; 3] = fds.try_into().map_err(|v: Vec<OwnedFd>| {
        HandoverError::Invalid(format!("{} descriptors (three expected)", v.len()))
    })?;
    Ok((h, stdio))
}

fn eof_is_closed(e: std::io::Error) -> HandoverError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        HandoverError::Closed
    } else {
        HandoverError::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn the_turn_and_three_descriptors_arrive_and_nothing_after_is_read() {
        let (sup, child) = UnixStream::pair().unwrap();
        let files: Vec<std::fs::File> = (0..3).map(|_| tempfile::tempfile().unwrap()).collect();
        let h = Handover {
            conversation: "default".into(),
            timings: true,
        };
        send(
            sup.as_fd(),
            &h,
            [files[0].as_fd(), files[1].as_fd(), files[2].as_fd()],
        )
        .unwrap();
        // The protocol's first frame follows at once: it stays unread.
        (&sup).write_all(b"{\"next\":1}\n").unwrap();
        let (got, fds) = receive(child.as_fd()).unwrap();
        assert_eq!(got, h);
        for (fd, f) in fds.iter().zip(&files) {
            let a = nix::sys::stat::fstat(fd.as_fd()).unwrap();
            let b = nix::sys::stat::fstat(f.as_fd()).unwrap();
            assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
        }
        let mut rest = String::new();
        drop(sup);
        (&child).read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "{\"next\":1}\n");
    }

    #[test]
    fn a_closed_channel_a_huge_length_or_missing_descriptors_are_refused() {
        let (sup, child) = UnixStream::pair().unwrap();
        drop(sup);
        assert!(matches!(receive(child.as_fd()), Err(HandoverError::Closed)));

        let (sup, child) = UnixStream::pair().unwrap();
        (&sup).write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert!(matches!(
            receive(child.as_fd()),
            Err(HandoverError::Invalid(_))
        ));

        let (sup, child) = UnixStream::pair().unwrap();
        let body = br#"{"conversation":"default"}"#;
        (&sup)
            .write_all(&(body.len() as u32).to_be_bytes())
            .unwrap();
        (&sup).write_all(body).unwrap();
        match receive(child.as_fd()) {
            Err(HandoverError::Invalid(m)) => assert!(m.contains("0 descriptors"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
