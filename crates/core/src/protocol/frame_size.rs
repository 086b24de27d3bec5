//! How large a frame may be ([`MAX_FRAME_BYTES`]), what a request's payload
//! may take of it, and how many bytes a value takes encoded.

/// Largest accepted frame, newline excluded. Larger lines are skipped whole
/// and answered with a `frame_too_large` error.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// What one request's payload may take of a frame: the rest is the
/// envelope (`{"type":"request","id":…,"method":…,"params":{…}}`) with room
/// to spare.
pub const FRAME_PAYLOAD_BUDGET: usize = MAX_FRAME_BYTES - 64 * 1024;

/// The bytes `value` takes encoded as JSON, counted without building it.
pub fn encoded_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Plain data cannot fail to encode; an error counts as too large.
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}
