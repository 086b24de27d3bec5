//! Violations and the exact stderr blocks the hook prints (spec §2.3, §2.5).

use super::options::Policy;

/// Which rule produced a violation (for callers that branch on it; the
/// message text is the contract shown to the agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A path that is not valid UTF-8. [B]
    NonUtf8Path,
    /// Memory Markdown content that is not valid UTF-8. [B]
    NonUtf8Content,
    /// `skills/<file>.md` instead of `skills/<name>/SKILL.md`.
    FlatSkill,
    /// A frontmatter rule of §2.4.
    Frontmatter,
    /// `.memfs.config.json` changed without approval.
    ConfigProtected,
    /// `.memfs.config.json` is not a regular file.
    ConfigNotRegular,
    /// `.memfs.config.json` does not parse or has invalid fields.
    ConfigInvalid,
    /// Root `MEMORY.md` missing under v2.
    RootIndexRequired,
    /// A directory of a memory file lacks its `MEMORY.md`.
    MissingIndex,
    /// A `readOnlyFiles` path was created, changed or removed.
    ReadOnly,
    /// Memory Markdown that is a symlink, gitlink or other non-regular entry.
    NotRegular,
    /// An opt-in `formatting` rule.
    Formatting,
    /// Depth above `maxDepth`.
    Depth,
    /// A file above its character limit.
    FileCharacters,
    /// Root Markdown above `maxCoreMemoryCharacters`.
    CoreBudget,
    /// A file above the hard byte limit. [B]
    FileBytes,
    /// A possible credential. [B]
    Secret,
    /// A path with a `.git` component. [B]
    GitPath,
    /// `.gitmodules` or `.gitattributes`. [B]
    GitMetadata,
    /// A gitlink (submodule entry). [B]
    Gitlink,
    /// A symlink leaving the tree or entering `.git`. [B]
    SymlinkOutside,
    /// Two paths equal but for case. [B]
    CaseCollision,
    /// A name with a control, bidi or line-separator character. [B]
    UnsafeName,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NonUtf8Path => "non-utf8-path",
            Rule::NonUtf8Content => "non-utf8-content",
            Rule::FlatSkill => "flat-skill",
            Rule::Frontmatter => "frontmatter",
            Rule::ConfigProtected => "config-protected",
            Rule::ConfigNotRegular => "config-not-regular",
            Rule::ConfigInvalid => "config-invalid",
            Rule::RootIndexRequired => "root-index-required",
            Rule::MissingIndex => "missing-index",
            Rule::ReadOnly => "read-only",
            Rule::NotRegular => "not-regular",
            Rule::Formatting => "formatting",
            Rule::Depth => "depth",
            Rule::FileCharacters => "file-characters",
            Rule::CoreBudget => "core-budget",
            Rule::FileBytes => "file-bytes",
            Rule::Secret => "secret",
            Rule::GitPath => "git-path",
            Rule::GitMetadata => "git-metadata",
            Rule::Gitlink => "gitlink",
            Rule::SymlinkOutside => "symlink-outside",
            Rule::CaseCollision => "case-collision",
            Rule::UnsafeName => "unsafe-name",
        }
    }
}

/// One problem. `message` is the full line the hook prints (without the
/// two-space indent), e.g. `a/b/c/d.md: depth 3 exceeds maxDepth 2`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The repo-relative path concerned, if any (`None` for the core budget).
    pub path: Option<String>,
    pub message: String,
    pub rule: Rule,
}

impl Violation {
    pub fn new(path: Option<&str>, rule: Rule, message: String) -> Self {
        Violation {
            path: path.map(str::to_string),
            message,
            rule,
        }
    }
}

/// Which stage stopped the commit; decides the block's wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// v2 per-file stage: `Memory validation failed:`.
    MemoryFiles,
    /// Legacy per-file stage: `Frontmatter validation failed:`.
    LegacyFrontmatter,
    /// Constraints stage: `Memory validation blocked this commit.`
    Constraints,
}

/// The outcome of one validation. Empty `violations` = the commit may proceed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub block: Block,
    pub policy: Policy,
    /// In emission order (the order the hook prints them).
    pub violations: Vec<Violation>,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// The message lines, in order.
    pub fn messages(&self) -> Vec<&str> {
        self.violations.iter().map(|v| v.message.as_str()).collect()
    }

    /// The pre-commit block, byte for byte as the hook prints it (every line
    /// newline-terminated). Empty when there is nothing to report.
    pub fn render_block(&self) -> String {
        if self.is_ok() {
            return String::new();
        }
        let mut out = String::new();
        match self.block {
            Block::MemoryFiles | Block::LegacyFrontmatter => {
                out.push_str(if self.block == Block::MemoryFiles {
                    "Memory validation failed:\n"
                } else {
                    "Frontmatter validation failed:\n"
                });
                // The bash hook builds "\n  e1\n  e2" and echoes it: one blank
                // line, then the indented errors.
                out.push('\n');
                self.push_errors(&mut out);
            }
            Block::Constraints => {
                out.push_str("Memory validation blocked this commit.\n");
                out.push_str("No files were committed. Your staged changes are still present.\n");
                out.push_str(
                    "Validation checks the complete repository, so these problems may predate your staged changes.\n",
                );
                out.push('\n');
                out.push_str("Fix these problems:\n");
                self.push_errors(&mut out);
                out.push('\n');
                if self.policy == Policy::RootMarker {
                    out.push_str(
                        "Move non-core detail out of root Markdown and behind MEMORY.md indexes.\n",
                    );
                }
                out.push_str("Split files above their per-file limit, then retry the commit.\n");
                out.push_str("Limits come from .memfs.config.json, or the Letta Code defaults when it is absent.\n");
                out.push_str("Do not raise or disable these limits unless the user explicitly approves it.\n");
            }
        }
        out
    }

    /// The block as the operator reads it (`memory create`, `memory
    /// commit`, …): the same findings, in the operator's voice. The hook's
    /// block speaks to an agent — "your staged changes are still
    /// present", "unless the user approves" — which is wrong for the user
    /// at the command line, whose working tree a refused command leaves
    /// exactly as it was.
    pub fn render_for_operator(&self) -> String {
        if self.is_ok() {
            return String::new();
        }
        // The per-file blocks name findings only: one text for both.
        if self.block != Block::Constraints {
            return self.render_block();
        }
        let mut out = String::from(
            "Memory validation blocked this commit (it checks the whole repository, so a \
             problem may predate this change):\n",
        );
        self.push_errors(&mut out);
        if self.policy == Policy::RootMarker {
            out.push_str(
                "Move non-core detail out of root Markdown and behind MEMORY.md indexes.\n",
            );
        }
        out.push_str(
            "Split files above their per-file limit. The limits are .memfs.config.json's \
             (Letta Code's defaults when it is absent); a change to that file needs \
             MINI_LETTA_CONSTRAINTS_UPDATE=1.\n",
        );
        out
    }

    /// The audit block (`Memory constraints failed:` + indented errors), used
    /// for committed revisions where "staged changes" would be wrong.
    pub fn render_audit(&self) -> String {
        if self.is_ok() {
            return String::new();
        }
        let mut out = String::from("Memory constraints failed:\n");
        self.push_errors(&mut out);
        out
    }

    fn push_errors(&self, out: &mut String) {
        for v in &self.violations {
            out.push_str("  ");
            out.push_str(&v.message);
            out.push('\n');
        }
    }
}
