//! The supervisor's wire decoding never panics: any bytes, split anywhere,
//! become lines no longer than the frame limit (or a too-large marker), and
//! every line decodes to a frame or a typed error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mini_letta::protocol::{Line, LineSplitter, MAX_FRAME_BYTES, decode_client};

fuzz_target!(|data: &[u8]| {
    let cut = data.first().map(|b| *b as usize).unwrap_or(0);
    let (a, b) = data.split_at(cut.min(data.len()));
    let mut splitter = LineSplitter::new();
    for chunk in [a, b] {
        for line in splitter.push(chunk) {
            if let Line::Frame(bytes) = line {
                assert!(bytes.len() <= MAX_FRAME_BYTES);
                let _ = decode_client(&bytes);
            }
        }
    }
    let _ = decode_client(data);
});
