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
//! * `frame_size.rs` — how large a frame may be ([`MAX_FRAME_BYTES`]) and
//!   [`encoded_len`].
//!
//! The CLI, the supervisor and the agent child all speak through this
//! module; the agent child knows nothing else of the supervisor or of the
//! model providers.

pub mod client;
pub mod events;
mod frame_size;
pub mod frames;
pub mod handover;
pub mod messages;
pub mod replies;
pub mod task;
pub mod timings;
pub mod turn;

pub use events::Event;
pub use frame_size::{FRAME_PAYLOAD_BUDGET, MAX_FRAME_BYTES, encoded_len};

pub use frames::{
    Call, ClientFrame, Committed, ErrorBody, ErrorCode, FrameError, Line, LineSplitter, LogLevel,
    METHODS, Outcome, PeerKind, ReflectParams, ServerFrame, SpawnParams, StdioMode, TurnParams,
    decode_client, encode,
};

/// Version carried in every `hello`.
pub const PROTOCOL_VERSION: u32 = 1;

/// The variable naming a child's channel descriptor (the wire's entry point
/// in a child; the agent keeps it from the programs it runs).
pub const CHANNEL_FD_ENV: &str = "MINI_LETTA_CHANNEL_FD";
