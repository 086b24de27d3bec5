//! `mini-letta memory`'s subcommands and their options.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Compile a memory repository's HEAD and print coreMemory (exact bytes).
    ///
    /// Reads only what is committed at HEAD. memfs-v2 (root MEMORY.md) renders
    /// root files and first-level indexes; memfs-v1 renders letta-code's
    /// layout with a <memory_metadata> block built from the options below.
    /// Exact bytes in a pipe; on a terminal, control characters are shown
    /// visibly (`^[`, `\u{7}`).
    #[command(after_help = "Examples:
  mini-letta memory compile -a owl
  mini-letta memory compile --memory-dir ./memory --json
  mini-letta memory compile --memory-dir ./memory --now 2026-01-01T00:00:00Z")]
    Compile(CompileArgs),
    /// Print a file as committed at HEAD (exact bytes), or with --json its
    /// frontmatter and body.
    ///
    /// Exact bytes in a pipe; on a terminal, control characters are shown
    /// visibly (`^[`, `\u{7}`) so a file cannot drive it.
    #[command(after_help = "Examples:
  mini-letta memory show persona.md
  mini-letta memory show -a owl projects/MEMORY.md --json")]
    Show {
        #[command(flatten)]
        target: AgentArg,
        /// Repository-relative path, e.g. persona.md or projects/MEMORY.md.
        path: String,
        /// Print {"path", "revision", "role", "bytes", "description",
        /// "read_only", "frontmatter", "body", "content"} (role as in
        /// `memory tree`; read_only from the frontmatter's `read_only`).
        #[arg(long)]
        json: bool,
    },
    /// List HEAD's paths with their role (core, root-index, directory-index,
    /// on-demand, unindexed, skill, other).
    #[command(after_help = "Examples:
  mini-letta memory tree
  mini-letta memory tree -a owl --json")]
    Tree {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"format", "revision", "entries": [{"path", "role", "bytes"}]}.
        #[arg(long)]
        json: bool,
    },
    /// The uncommitted changes of an agent's memory: every path whose
    /// working-tree file differs from HEAD (modified, added, deleted,
    /// untracked), as the supervisor sees them. An agent commits them with
    /// its memory tool (`commit`); you with `memory commit`.
    #[command(after_help = "Examples:
  mini-letta memory status
  mini-letta memory status -a owl --json")]
    Status {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "head", "dirty": [path, …]}.
        #[arg(long)]
        json: bool,
    },
    /// Validate the staged tree (default) or a revision with the MemFS
    /// validator; exit 0 when valid, 1 with the validator's block on stderr
    /// when not, 2 when the repository cannot be read. This is what the
    /// pre-commit hook runs. MINI_LETTA_CONSTRAINTS_UPDATE=1 approves a
    /// change to .memfs.config.json.
    #[command(after_help = "Examples:
  mini-letta memory validate
  mini-letta memory validate --rev HEAD~1 --json
  mini-letta memory validate --memory-dir ./memory")]
    Validate(ValidateArgs),
    /// Create a memory file with `name` (from the file name) and
    /// `description` frontmatter, and commit it.
    #[command(after_help = "Examples:
  mini-letta memory create projects/garden.md --description 'The garden project.'
  mini-letta memory create -a owl notes.md --description 'Loose notes.' --body '- first'")]
    Create {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative path ending in .md, e.g. projects/notes.md.
        path: String,
        /// One-line description (frontmatter `description`).
        #[arg(long, value_name = "D", allow_hyphen_values = true)]
        description: String,
        /// Text below the frontmatter.
        #[arg(long, value_name = "B", default_value = "", allow_hyphen_values = true)]
        body: String,
        /// Read the text below the frontmatter from file F (`-`: standard
        /// input) instead of --body: for a body too long for a command line.
        #[arg(long, value_name = "F", conflicts_with = "body")]
        body_file: Option<PathBuf>,
    },
    /// Replace the first occurrence of --old in a file's body with --new and
    /// commit; an empty --new deletes every body line containing --old.
    #[command(after_help = "Examples:
  mini-letta memory replace human.md --old 'likes tea' --new 'likes coffee'
  mini-letta memory replace human.md --old 'outdated' --new ''")]
    Replace {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative path of the file to edit.
        path: String,
        /// The text to find (its first occurrence in the body).
        #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
        old: String,
        /// The text to put in its place (empty: delete the lines holding --old).
        #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
        new: String,
    },
    /// Insert text into a file's body (before body line N, or at the end) and commit.
    #[command(after_help = "Examples:
  mini-letta memory insert human.md --text '- likes tea'
  mini-letta memory insert -a owl persona.md --text '- speaks plainly' --line 1")]
    Insert {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative path of the file to edit.
        path: String,
        /// The text to insert (one or more lines).
        #[arg(long, value_name = "T", allow_hyphen_values = true)]
        text: String,
        /// 1-based body line to insert before, from 1 to the body's line
        /// count + 1 (which appends) [default: append].
        #[arg(long, value_name = "N")]
        line: Option<usize>,
    },
    /// Delete a file and commit.
    #[command(after_help = "Examples:
  mini-letta memory delete projects/old.md")]
    Delete {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative path of the file to delete.
        path: String,
    },
    /// Move a file and commit both paths.
    #[command(after_help = "Examples:
  mini-letta memory rename facts.md projects/facts.md")]
    Rename {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// The file's current repository-relative path.
        from: String,
        /// Its new repository-relative path.
        to: String,
    },
    /// Set a file's frontmatter `description` and commit.
    #[command(after_help = "Examples:
  mini-letta memory set-description human.md --description 'About the human.'")]
    SetDescription {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative path of the file.
        path: String,
        /// The new one-line description.
        #[arg(long, value_name = "D", allow_hyphen_values = true)]
        description: String,
    },
    /// Commit edits already made in the working tree to exactly these paths
    /// (added, modified or deleted; directories included), as `git commit --
    /// PATHS`: nothing else that is staged rides along.
    #[command(after_help = "Examples:
  mini-letta memory commit -m 'persona: plainer' persona.md
  mini-letta memory commit -a owl -m 'notes' notes/")]
    Commit {
        #[command(flatten)]
        target: AgentArg,
        /// Print {"agent", "name", "op", "commit", "changed"} (or, refused,
        /// "refused" and the validator's "violations") instead of a line.
        #[arg(long)]
        json: bool,
        /// Repository-relative paths (files or directories) to commit.
        #[arg(required = true)]
        paths: Vec<String>,
        /// The commit message.
        #[arg(short = 'm', long = "message", value_name = "MSG")]
        message: String,
    },
    /// HEAD's history, newest first, optionally only commits touching PATH.
    #[command(after_help = "Examples:
  mini-letta memory log
  mini-letta memory log -n 5 human.md
  mini-letta memory log -a owl --json")]
    Log {
        #[command(flatten)]
        target: AgentArg,
        /// Only commits that changed this file or directory.
        path: Option<String>,
        /// At most N commits.
        #[arg(short = 'n', long = "max-count", value_name = "N")]
        max_count: Option<usize>,
        /// Print {"entries": [{id, parents, author, email, time, summary, message}]}.
        #[arg(long)]
        json: bool,
    },
    /// Unified diff of the working tree (untracked files included) against
    /// REV [default: HEAD].
    ///
    /// Exact bytes in a pipe (for `git apply`); on a terminal, control
    /// characters are shown visibly (`^[`, `\u{7}`).
    #[command(after_help = "Examples:
  mini-letta memory diff
  mini-letta memory diff HEAD~2 --json")]
    Diff {
        #[command(flatten)]
        target: AgentArg,
        /// The revision to compare with (a commit id, HEAD~N, a branch) [default: HEAD].
        rev: Option<String>,
        /// Print {"revision", "files": [{path, status}], "patch"}.
        #[arg(long)]
        json: bool,
    },
    /// Stress the validated commit: rewrite PATH and commit it COUNT times
    /// (with --reject-every K, also attempt an invalid write every K
    /// iterations, which must be refused), then print {"committed",
    /// "rejected", "millis"}. Run two at once to check concurrent writers.
    #[command(after_help = "Examples:
  mini-letta memory commit-loop --path stress.md --count 100
  mini-letta memory commit-loop -a owl --path stress.md --count 50 --reject-every 10")]
    CommitLoop {
        #[command(flatten)]
        target: AgentArg,
        /// Repository-relative path of the file rewritten each time.
        #[arg(long, value_name = "PATH")]
        path: String,
        /// How many valid commits to make.
        #[arg(long, value_name = "N")]
        count: usize,
        /// Also attempt an invalid write every K iterations (must be refused).
        #[arg(long, value_name = "K")]
        reject_every: Option<usize>,
    },
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The memory repository's working tree (default: the agent's).
    #[arg(long, value_name = "DIR", conflicts_with = "agent")]
    pub(crate) memory_dir: Option<PathBuf>,
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    pub(crate) agent: Option<String>,
    /// Validate the staged index ($GIT_INDEX_FILE when set) against HEAD (the default).
    #[arg(long, conflicts_with = "rev")]
    pub(crate) staged: bool,
    /// Audit a committed revision against its own config instead.
    #[arg(long, value_name = "REV")]
    pub(crate) rev: Option<String>,
    /// Print {"ok", "mode", "policy", "block", "violations": [{path, message, rule}]}.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub struct AgentArg {
    /// Agent id or name (default: the only agent).
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    pub agent: Option<String>,
    /// When the command ends, print where its time went (the steps of
    /// this process and of the commit, on the monotonic clock) as a table
    /// on stderr.
    #[arg(long)]
    pub timings: bool,
}

#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The memory repository (working tree or git directory).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "agent",
        conflicts_with = "agent"
    )]
    pub(crate) memory_dir: Option<PathBuf>,
    /// Compile this agent's memory with its id and system prompt.
    #[arg(short = 'a', long = "agent", value_name = "AGENT")]
    pub(crate) agent: Option<String>,
    /// AGENT_ID in the memfs-v1 metadata block [default: the agent's id, else agent-local].
    #[arg(long, value_name = "ID")]
    pub(crate) agent_id: Option<String>,
    /// CONVERSATION_ID in the memfs-v1 metadata block.
    #[arg(long, value_name = "ID", default_value = "default")]
    pub(crate) conversation_id: String,
    /// Compilation time (RFC 3339) [default: now].
    #[arg(long, value_name = "RFC3339")]
    pub(crate) now: Option<String>,
    /// Messages already in recall memory (memfs-v1 metadata).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) message_count: u64,
    /// Raw system prompt [default: the agent's, else "{CORE_MEMORY}"].
    #[arg(long, value_name = "TEXT", conflicts_with = "system_file")]
    pub(crate) system: Option<String>,
    /// Read the raw system prompt from a file.
    #[arg(long, value_name = "F")]
    pub(crate) system_file: Option<PathBuf>,
    /// Print {content, coreMemory, compiledAt, rawSystemHash, memfsRevision, memoryFormat}.
    #[arg(long)]
    pub(crate) json: bool,
}
