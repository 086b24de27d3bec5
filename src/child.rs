//! The hidden `__child ROLE` entry: what every supervisor-launched process
//! runs first, single-threaded, before the real program.
//!
//! It says hello on the inherited channel (descriptor 3) so the supervisor
//! knows the child is up, then replaces itself with the requested program,
//! leaving the channel open for it (`MINI_LETTA_CHANNEL_FD=3`). The
//! confinement stage (landlock, seccomp) is applied here, before `exec`,
//! once the sandbox layers exist.

use std::io::Write;
use std::os::fd::{BorrowedFd, FromRawFd};
use std::os::unix::process::CommandExt;

use crate::protocol::{ClientFrame, PROTOCOL_VERSION, PeerKind, encode};

/// Exit code when the child stage itself fails (not the program).
pub const STAGE_FAILURE: i32 = 125;

/// Run the child stage; returns only on failure.
pub fn run(role: &str, agent: &str, argv: &[String]) -> std::io::Error {
    tracing::debug!(role, agent, "child stage");
    if let Err(e) = say_hello() {
        return e;
    }
    let Some((program, args)) = argv.split_first() else {
        return std::io::Error::other("no program to run");
    };
    std::process::Command::new(program).args(args).exec()
}

fn say_hello() -> std::io::Result<()> {
    // SAFETY: descriptor 3 is the channel the supervisor installed; we only
    // borrow it for one write and leave it open for the program.
    let fd = unsafe { BorrowedFd::borrow_raw(3) };
    let dup = fd.try_clone_to_owned()?;
    let mut stream = unsafe {
        std::os::unix::net::UnixStream::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(dup))
    };
    stream.write_all(&encode(&ClientFrame::Hello {
        version: PROTOCOL_VERSION,
        peer: PeerKind::Child,
    }))
}
