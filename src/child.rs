//! The child stage (`mini-letta-stage2 ROLE …`): what every supervisor-launched process
//! runs first, single-threaded, before the real program.
//!
//! It says hello on the inherited channel (descriptor 3) so the supervisor
//! knows the child is up, then replaces itself with the requested program,
//! leaving the channel open for it (`MINI_LETTA_CHANNEL_FD=3`). Stage 2 of
//! the confinement (capability check, landlock, seccomp) is applied here,
//! before `exec`: landlock confines only the calling thread, so it must run
//! in this fresh single-threaded process.

use std::io::Write;
use std::os::fd::BorrowedFd;
use std::os::unix::process::CommandExt;

use crate::protocol::{ClientFrame, PROTOCOL_VERSION, PeerKind, encode};
use crate::sandbox::stage2::StagePolicy;

/// Exit code when the child stage itself fails (not the program).
pub const STAGE_FAILURE: i32 = 125;

/// Run the child stage; returns only on failure. `policy` is the stage-2
/// confinement (JSON of [`StagePolicy`]) the supervisor planned; it is
/// applied before anything else, and failing to apply it is fatal.
pub fn run(role: &str, agent: &str, policy: Option<&str>, argv: &[String]) -> std::io::Error {
    tracing::debug!(role, agent, "child stage");
    if let Some(text) = policy {
        let policy: StagePolicy = match serde_json::from_str(text) {
            Ok(p) => p,
            Err(e) => return std::io::Error::other(format!("invalid stage policy: {e}")),
        };
        if let Err(e) = crate::sandbox::stage2::apply(&policy) {
            return std::io::Error::other(format!("cannot confine this child: {e}"));
        }
    }
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
    let mut stream = std::os::unix::net::UnixStream::from(fd.try_clone_to_owned()?);
    stream.write_all(&encode(&ClientFrame::Hello {
        version: PROTOCOL_VERSION,
        peer: PeerKind::Child,
    }))
}
