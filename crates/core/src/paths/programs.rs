//! Where mini-letta's programs are installed: the CLI, the child stage
//! and the agent-side program, side by side.

use std::path::{Path, PathBuf};

/// mini-letta's programs, installed side by side: the user's CLI, the
/// child stage every confined child starts with, and the agent-side
/// program (the agent's turn, the escape probes). Only the CLI takes user
/// commands; the others are started by the supervisor and the CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Programs {
    pub cli: PathBuf,
    pub stage: PathBuf,
    pub agent: PathBuf,
}

/// File name of the child-stage program.
pub const STAGE_PROGRAM_NAME: &str = "mini-letta-stage2";
/// File name of the agent-side program.
pub const AGENT_PROGRAM_NAME: &str = "mini-letta-agent";

impl Programs {
    /// The programs beside `cli` (this process's executable, normally).
    pub fn beside(cli: &Path) -> Self {
        Programs {
            cli: cli.to_path_buf(),
            stage: cli.with_file_name(STAGE_PROGRAM_NAME),
            agent: cli.with_file_name(AGENT_PROGRAM_NAME),
        }
    }

    /// The programs beside the running executable, each checked to exist:
    /// a partial install fails here, by name, not later inside a sandbox.
    pub fn installed() -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let found = Self::beside(&exe);
        for p in [&found.stage, &found.agent] {
            if !p.is_file() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "{} is missing: mini-letta's programs ({}, {}, {}) must be installed together",
                        p.display(),
                        exe.file_name()
                            .and_then(|n| n.to_str())
                            .unwrap_or("mini-letta"),
                        STAGE_PROGRAM_NAME,
                        AGENT_PROGRAM_NAME
                    ),
                ));
            }
        }
        Ok(found)
    }
}
