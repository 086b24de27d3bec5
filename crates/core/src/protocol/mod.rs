//! The wire protocol between the supervisor and its peers (CLIs on the control
//! socket, children on their socketpair channel), and the only module the
//! agent child uses to talk to anyone. See `docs/protocol.md`.
//!
//! Newline-delimited JSON, one frame per line. Client → supervisor frames are
//! [`ClientFrame`]; supervisor → client frames are [`ServerFrame`]. A peer
//! opens with `hello` carrying [`PROTOCOL_VERSION`]; requests carry an `id`
//! that the response echoes; events carry none. Decoding never panics: a bad
//! frame becomes a [`FrameError`] that the supervisor answers with an `error`
//! frame, and the connection keeps working.
//!
//! * [`frames`] — the frames, requests ([`Call`]), outcomes, error codes,
//!   the decoder, the encoder and the line splitter.
//! * [`events`] — the supervisor's events, typed ([`Event`]).
//! * [`messages`] — what `model.complete` carries: messages, tool specs,
//!   model requests, responses and failures.
//! * [`replies`] — what the supervisor answers, one type per method.
//! * [`task`] — what a sub-agent child is launched to do.
//! * [`turn`] — the agent child's own stream: its turn input and the turn
//!   events it reports.
//! * [`client`] — the blocking client (CLI, children, tests).
//!
//! The CLI, the supervisor and the agent child all speak through this
//! module; the agent child knows nothing else of the supervisor or of the
//! model providers.

pub mod client;
pub mod events;
pub mod frames;
pub mod handover;
pub mod messages;
pub mod replies;
pub mod task;
pub mod timings;
pub mod turn;

pub use events::Event;

pub use frames::{
    Call, ClientFrame, Committed, ErrorBody, ErrorCode, FrameError, Line, LineSplitter, LogLevel,
    METHODS, Outcome, PeerKind, ReflectParams, ServerFrame, SpawnParams, StdioMode, TurnParams,
    decode_client, encode,
};

/// Version carried in every `hello`.
pub const PROTOCOL_VERSION: u32 = 1;

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

/// The variable naming a child's channel descriptor (the wire's entry point
/// in a child; the agent keeps it from the programs it runs).
pub const CHANNEL_FD_ENV: &str = "MINI_LETTA_CHANNEL_FD";
