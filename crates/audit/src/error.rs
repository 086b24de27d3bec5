//! [`AuditError`]: what appending to, reading or configuring the audit log
//! can fail with.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("audit log {}: {detail}", path.display())]
    Corrupt { path: PathBuf, detail: String },
    /// `config.toml`'s `[audit]` table.
    #[error("{}: {detail}", path.display())]
    Config { path: PathBuf, detail: String },
    #[error("the audit log's writer has stopped")]
    Closed,
    #[error(
        "the audit log's disk is down to its reserve ({free} bytes free, {reserve} kept for \
         records of what has already happened): refused before the disk fills; free space \
         under {}", dir.display()
    )]
    DiskReserve {
        dir: PathBuf,
        free: u64,
        reserve: u64,
    },
}
