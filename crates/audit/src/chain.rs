//! The files of the chain: the rolled-over ones, oldest first, then the
//! current one.

use std::path::PathBuf;

use super::error::AuditError;
use crate::paths::Home;

/// The rolled-over files, oldest first.
pub fn rotated(home: &Home) -> Result<Vec<(u64, PathBuf)>, AuditError> {
    let dir = home.audit_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(AuditError::Io { path: dir, source }),
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let n = crate::paths::audit_rotated_number(e.file_name().to_str()?)?;
            Some((n, home.audit_rotated(n)))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// Every file of the chain, oldest first (the current log last).
pub(crate) fn chain_files(home: &Home) -> Result<Vec<PathBuf>, AuditError> {
    let mut files: Vec<PathBuf> = rotated(home)?.into_iter().map(|(_, p)| p).collect();
    let current = home.audit_log();
    if current.exists() {
        files.push(current);
    }
    Ok(files)
}
