//! The child's side of the egress path, run by the child stage before any
//! program of the child: say on descriptor 4 that the network namespace
//! exists, wait for the supervisor to make the proxy's endpoint in it,
//! then close the descriptor — the program never holds it.
//!
//! One byte each way: `n` from the stage (in the namespace now), then `g`
//! (the endpoint listens) or `x` (it could not be made: the child runs
//! with no network) from the supervisor.

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};

/// The proxy's port on the loopback of every command's own network
/// namespace (each namespace has its own ports: nothing else uses it).
pub const PORT: u16 = 3128;

/// The descriptor the supervisor installs the egress handshake on.
pub const SYNC_FD: i32 = 4;

/// How long the stage waits for the supervisor's answer.
const WAIT: Duration = Duration::from_secs(30);

/// What the stage policy says of egress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageEgress {
    /// The proxy's port on the namespace's `127.0.0.1`: the only TCP port
    /// landlock lets the child connect to.
    pub port: u16,
}

/// Tell the supervisor the namespace is ready and wait for its answer:
/// `Ok(true)` when the endpoint listens, `Ok(false)` when the supervisor
/// declined. Descriptor 4 is closed either way.
pub(crate) fn await_endpoint() -> Result<bool, String> {
    // SAFETY: descriptor 4 is the handshake the supervisor installed for a
    // child whose policy has egress; nothing else in this single-threaded
    // stage owns it, and it is closed (dropped) here.
    let fd = unsafe { OwnedFd::from_raw_fd(SYNC_FD) };
    handshake(fd.as_fd()).map_err(|e| format!("the proxy endpoint was not made: {e}"))
}

fn handshake(fd: BorrowedFd<'_>) -> Result<bool, String> {
    use std::os::fd::AsRawFd;
    nix::sys::socket::send(
        fd.as_raw_fd(),
        b"n",
        nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut poll = [PollFd::new(fd, PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(WAIT).unwrap_or(PollTimeout::MAX);
    loop {
        match nix::poll::poll(&mut poll, timeout) {
            Ok(0) => return Err(format!("no answer within {}s", WAIT.as_secs())),
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("poll: {e}")),
        }
    }
    let mut byte = [0u8; 1];
    match nix::unistd::read(fd, &mut byte) {
        Ok(1) if byte[0] == b'g' => Ok(true),
        Ok(1) if byte[0] == b'x' => Ok(false),
        Ok(_) => Err("the supervisor closed the handshake".into()),
        Err(e) => Err(format!("read: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_handshake_reads_the_supervisors_answer() {
        for (answer, want) in [(b"g", Ok(true)), (b"x", Ok(false))] {
            let (mut sup, child) = UnixStream::pair().unwrap();
            let t = std::thread::spawn(move || {
                let mut b = [0u8; 1];
                sup.read_exact(&mut b).unwrap();
                assert_eq!(&b, b"n");
                sup.write_all(answer).unwrap();
            });
            assert_eq!(handshake(child.as_fd()), want);
            t.join().unwrap();
        }
        let (sup, child) = UnixStream::pair().unwrap();
        drop(sup);
        assert!(handshake(child.as_fd()).is_err());
    }
}
