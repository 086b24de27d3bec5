//! The child stage (`mini-letta-stage2 ROLE …`): what every supervisor-launched process
//! runs first, single-threaded, before the real program.
//!
//! It says hello on the inherited channel (descriptor 3) so the supervisor
//! knows the child is up, then replaces itself with the requested program,
//! leaving the channel open for it (`MINI_LETTA_CHANNEL_FD=3`). Stage 2 of
//! the confinement (capability check, landlock, seccomp) is applied here,
//! before `exec`: landlock confines only the calling thread, so it must run
//! in this fresh single-threaded process.

use crate::protocol::timings;
use std::io::Write;
use std::os::fd::BorrowedFd;
use std::os::unix::process::CommandExt;

use crate::protocol::PROTOCOL_VERSION;
use crate::stage2::StagePolicy;

/// The launcher's own failures before `exec` exit with it too, so it is
/// the sandbox's.
pub use crate::STAGE_FAILURE;
/// Exit code when the program to run does not exist (as shells use).
pub const COMMAND_NOT_FOUND: i32 = 127;
/// Exit code when the program exists but cannot be executed (as shells use).
pub const COMMAND_NOT_EXECUTABLE: i32 = 126;

/// Why the child stage did not become the program.
#[derive(Debug)]
pub enum StageFailure {
    /// The stage itself failed (confinement, the hello, no program).
    Stage(std::io::Error),
    /// `exec` of the program failed.
    Exec {
        program: String,
        error: std::io::Error,
    },
}

impl StageFailure {
    /// The exit status the stage ends with: 127 for a program that is not
    /// there, 126 for one that cannot be executed, else [`STAGE_FAILURE`].
    pub fn exit_code(&self) -> i32 {
        match self {
            StageFailure::Stage(_) => STAGE_FAILURE,
            StageFailure::Exec { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
                COMMAND_NOT_FOUND
            }
            StageFailure::Exec { .. } => COMMAND_NOT_EXECUTABLE,
        }
    }
}

impl std::fmt::Display for StageFailure {
    /// The line the stage prints after `mini-letta: `.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StageFailure::Stage(e) => write!(f, "child stage failed: {e}"),
            StageFailure::Exec { program, .. } if self.exit_code() == COMMAND_NOT_FOUND => {
                write!(f, "sandbox run: command not found: {program}")
            }
            StageFailure::Exec { program, error } => {
                // The reason in words, without "(os error N)".
                let reason = error.raw_os_error().map_or_else(
                    || error.to_string(),
                    |n| nix::errno::Errno::from_raw(n).desc().to_string(),
                );
                write!(f, "sandbox run: cannot execute {program}: {reason}")
            }
        }
    }
}

/// Run the child stage; returns only on failure. `policy` is the stage-2
/// confinement (JSON of [`StagePolicy`]) the supervisor planned; it is
/// applied before anything else, and failing to apply it is fatal.
pub fn run(role: &str, agent: &str, policy: Option<&str>, argv: &[String]) -> StageFailure {
    tracing::debug!(role, agent, "child stage");
    // The stage's marks go to the supervisor with its hello (`sandbox run
    // --timings` reads them there), and a turn's child hands them to the
    // agent program too, which reports them when the turn asked (`chat
    // --timings`): a few clock reads, so they are always taken.
    let timed = role == "agent";
    timings::enable();
    timings::mark("stage.start");
    if let Some(text) = policy {
        let policy: StagePolicy = match serde_json::from_str(text) {
            Ok(p) => p,
            Err(e) => {
                return StageFailure::Stage(std::io::Error::other(format!(
                    "invalid stage policy: {e}"
                )));
            }
        };
        if let Err(e) = crate::stage2::apply(&policy) {
            return StageFailure::Stage(std::io::Error::other(format!(
                "cannot confine this child: {e}"
            )));
        }
    }
    if let Err(e) = say_hello() {
        return StageFailure::Stage(e);
    }
    let Some((program, args)) = argv.split_first() else {
        return StageFailure::Stage(std::io::Error::other("no program to run"));
    };
    let mut command = std::process::Command::new(program);
    command.args(args);
    if timed {
        timings::mark("stage.exec");
        command.env(timings::STAGE_ENV, timings::encode(&timings::taken()));
    }
    let error = command.exec();
    StageFailure::Exec {
        program: program.clone(),
        error,
    }
}

fn say_hello() -> std::io::Result<()> {
    // SAFETY: descriptor 3 is the channel the supervisor installed; we only
    // borrow it for one write and leave it open for the program.
    let fd = unsafe { BorrowedFd::borrow_raw(3) };
    let mut stream = std::os::unix::net::UnixStream::from(fd.try_clone_to_owned()?);
    timings::mark("stage.hello");
    stream.write_all(&timings::hello_with_marks(
        PROTOCOL_VERSION,
        &timings::taken(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_failures_exit_as_shells_do() {
        let exec = |kind: std::io::Error| StageFailure::Exec {
            program: "tool".into(),
            error: kind,
        };
        let missing = exec(std::io::Error::from(nix::errno::Errno::ENOENT));
        assert_eq!(missing.exit_code(), 127);
        assert_eq!(missing.to_string(), "sandbox run: command not found: tool");
        let denied = exec(std::io::Error::from(nix::errno::Errno::EACCES));
        assert_eq!(denied.exit_code(), 126);
        assert_eq!(
            denied.to_string(),
            "sandbox run: cannot execute tool: Permission denied"
        );
        let stage = StageFailure::Stage(std::io::Error::other("no program to run"));
        assert_eq!(stage.exit_code(), STAGE_FAILURE);
        assert_eq!(stage.to_string(), "child stage failed: no program to run");
    }
}
