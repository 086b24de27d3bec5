//! What an append to the log needs: the writers' bounded lock, and where
//! the last complete line ends (what is past it is torn).

use std::os::unix::fs::FileExt;

/// How long an append waits for another writer of the same log.
const LOG_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The log, locked for this writer; a holder that never lets go (any
/// process of the agent's uid can take the lock) costs a bounded wait.
pub(super) fn lock_log(file: std::fs::File) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    crate::fsutil::flock_bounded(file, LOG_LOCK_WAIT, "the conversation log")
}

/// The length of `file` up to and including its last newline: what is
/// past it is a torn line. Reads the tail backwards in small blocks.
pub(super) fn complete_length(file: &std::fs::File) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    let mut end = len;
    let mut block = [0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(block.len() as u64);
        let chunk = &mut block[..(end - start) as usize];
        file.read_exact_at(chunk, start)?;
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}
