//! The outcome of one attack: blocked, escaped or skipped, with its
//! evidence or reason.

use serde::{Deserialize, Serialize};

/// The outcome of one attack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The attack failed the expected way (errno or observation).
    Blocked { evidence: String },
    /// The attack worked; `evidence` says what was reached.
    Escaped { evidence: String },
    /// The attack could not be attempted meaningfully here.
    Skipped { reason: String },
}

impl Verdict {
    pub fn blocked(evidence: impl Into<String>) -> Self {
        Self::Blocked {
            evidence: evidence.into(),
        }
    }

    pub fn escaped(evidence: impl Into<String>) -> Self {
        Self::Escaped {
            evidence: evidence.into(),
        }
    }

    pub fn skipped(reason: impl Into<String>) -> Self {
        Self::Skipped {
            reason: reason.into(),
        }
    }

    pub fn is_blocked(&self) -> bool {
        matches!(self, Self::Blocked { .. })
    }

    pub fn is_escaped(&self) -> bool {
        matches!(self, Self::Escaped { .. })
    }

    pub fn is_skipped(&self) -> bool {
        matches!(self, Self::Skipped { .. })
    }

    /// `blocked`, `escaped` or `skipped`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Blocked { .. } => "blocked",
            Self::Escaped { .. } => "escaped",
            Self::Skipped { .. } => "skipped",
        }
    }

    /// The evidence or the skip reason.
    pub fn detail(&self) -> &str {
        match self {
            Self::Blocked { evidence } | Self::Escaped { evidence } => evidence,
            Self::Skipped { reason } => reason,
        }
    }
}
