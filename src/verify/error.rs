//! Why `sandbox verify` could not run its catalogue (not a verdict: an
//! attack that got through is a result, not an error).

use crate::protocol::client::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("verify setup: {0}")]
    Setup(String),
    #[error(transparent)]
    Supervisor(#[from] crate::supervisor::SupervisorError),
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// A setup step's error, naming the step.
pub(super) fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> VerifyError + '_ {
    move |e| VerifyError::Setup(format!("{what}: {e}"))
}
