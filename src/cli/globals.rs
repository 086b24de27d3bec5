//! The options every command takes (`--home`, `-v`), and the home
//! directory and verbosity every command reads through them.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::console::style;
use crate::paths::Home;

/// Options every command takes.
#[derive(Debug, Args)]
pub(crate) struct Globals {
    /// Home directory holding agents, config and runtime files
    /// [default: $MINI_LETTA_HOME, else ~/.mini-letta].
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,

    /// More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG also works.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

impl Globals {
    /// How many `-v` were given.
    pub(crate) fn verbosity(&self) -> u8 {
        self.verbose
    }

    /// The `--home` given, if one was.
    pub(crate) fn home_flag(&self) -> Option<&Path> {
        self.home.as_deref()
    }

    pub(crate) fn home(&self) -> anyhow::Result<Home> {
        let home = Home::resolve(self.home.as_deref())?;
        // At default verbosity a command's stderr holds its own messages
        // only: any log record goes where the supervisor's go.
        crate::console::logging::divert_quiet_records_lazily(&home.supervisor_log());
        // Quota volumes do not survive a reboot: mount what is missing
        // before anything reads an agent (root only; one stat otherwise).
        if let Err(e) = crate::sandbox::volume::ensure_mounted(&home) {
            style::eprint_warning(&format!("cannot mount the agents' quota volumes: {e}"));
        }
        Ok(home)
    }
}
