//! Frames: what travels on a connection, one JSON object a line.
//! [`ClientFrame`] goes to the supervisor, [`ServerFrame`] comes back;
//! [`decode_client`] reads a peer's line without ever panicking,
//! [`encode`] writes one, and [`LineSplitter`] cuts a byte stream into
//! lines within [`MAX_FRAME_BYTES`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::events::Event;
use super::frame_size::MAX_FRAME_BYTES;

/// Who is speaking, as said in `hello`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerKind {
    Cli,
    Child,
}

/// A frame sent to the supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientFrame {
    Hello {
        version: u32,
        peer: PeerKind,
        /// The supervisor's control key (`run/control.key`), asked of a
        /// control connection where the supervisor's children could reach
        /// its socket (they share its uid and see the host's paths).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    Request {
        id: u64,
        #[serde(flatten)]
        call: Call,
    },
}

/// What a request asks for. Tagged by `method`, arguments in `params`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "method", content = "params")]
pub enum Call {
    /// No-op round trip.
    #[serde(rename = "ping")]
    Ping {},
    /// Supervisor facts (pid, uptime, home, children).
    #[serde(rename = "supervisor.status")]
    Status {},
    /// Graceful stop: children asked to finish, then killed.
    #[serde(rename = "supervisor.stop")]
    Stop {},
    /// The child table.
    #[serde(rename = "ps")]
    Ps {},
    /// Start a child for an agent. With `stdio: "passed"` the request's
    /// frame carries three file descriptors (stdin, stdout, stderr) as
    /// `SCM_RIGHTS` ancillary data.
    #[serde(rename = "child.spawn")]
    Spawn(SpawnParams),
    /// Send a signal to a child (default SIGTERM).
    #[serde(rename = "child.kill")]
    Kill {
        child: u64,
        #[serde(default)]
        signal: Option<i32>,
    },
    /// Where a child's launch went: the supervisor's marks (request,
    /// plan, fork, first frame, exit) and those its stage reported (each
    /// confinement layer), on the monotonic clock of `protocol::timings`.
    /// `sandbox run --timings` asks for them once its command ended.
    #[serde(rename = "child.timings")]
    ChildTimings { child: u64 },
    /// Receive `child.*` events on this connection.
    #[serde(rename = "events.subscribe")]
    Subscribe {},
    /// Validated commit of paths in the caller's memory checkout.
    #[serde(rename = "memory.commit")]
    MemoryCommit {
        paths: Vec<String>,
        message: String,
        /// Must be the caller's own agent when given.
        #[serde(default)]
        agent: Option<String>,
    },
    /// Take the agent's memory lease: the caller alone edits the agent's
    /// memory working tree until its next `memory.commit` (or
    /// `memory.release`, or its exit). Waits while another child holds it.
    #[serde(rename = "memory.lease")]
    MemoryLease {
        /// A child's own agent (implied); required on the control socket,
        /// where the lease lasts until the release or the connection's end.
        #[serde(default)]
        agent: Option<String>,
    },
    /// Give the memory lease back without committing.
    #[serde(rename = "memory.release")]
    MemoryRelease {},
    /// HEAD revision and uncommitted paths of the caller's memory checkout.
    #[serde(rename = "memory.status")]
    MemoryStatus {
        #[serde(default)]
        agent: Option<String>,
    },
    /// A model request; answered by `model.delta` events then a response.
    #[serde(rename = "model.complete")]
    ModelComplete { request: Value },
    /// What the supervisor knows of a model: its handle and the context
    /// window configured for it (`null` when none is). A child asks about
    /// its own recorded model; a CLI names one.
    #[serde(rename = "model.info")]
    ModelInfo {
        #[serde(default)]
        model: Option<String>,
    },
    /// Run one turn: the supervisor finds the agent, starts its `agent`
    /// child on the three descriptors sent with the frame (stdin, stdout,
    /// stderr), and answers when the child has exited, with its exit. One
    /// request per turn.
    #[serde(rename = "turn.run")]
    TurnRun(TurnParams),
    /// Cancel the running turn of a conversation: its child is stopped and
    /// the conversation records the interruption; the `turn.run` request
    /// answers with `cancelled: true`.
    #[serde(rename = "turn.cancel")]
    TurnCancel {
        /// Agent id or name; the only agent when absent.
        #[serde(default)]
        agent: Option<String>,
        #[serde(default = "default_conversation")]
        conversation: String,
    },
    /// A turn event from an agent child, re-broadcast to subscribers as
    /// `turn.event` (how `attach` follows a running turn).
    #[serde(rename = "turn.event")]
    TurnEvent { conversation: String, event: Value },
    /// A log line from a child, re-emitted through the supervisor's tracing.
    #[serde(rename = "log")]
    Log { level: LogLevel, message: String },
    /// A sub-agent child asks what it was launched to do: the task the
    /// supervisor recorded for it at launch (nothing in the request names it).
    #[serde(rename = "task.get")]
    TaskGet {},
    /// A sub-agent child's final report (kept with its task; the supervisor
    /// decides what becomes of it).
    #[serde(rename = "task.finish")]
    TaskFinish { report: String },
    /// Launch a reflection of an agent now (a manual launch: backoff does
    /// not apply). Answers `{launched: false, reason, message}` or
    /// `{launched: true, child, worktree, branch, …}`; with `wait`, answers
    /// once it has finished, with its finalize result.
    #[serde(rename = "reflect.run")]
    ReflectRun(ReflectParams),
    /// An agent's reflection state: lock, backoff, last result, cursors.
    #[serde(rename = "reflect.status")]
    ReflectStatus {
        #[serde(default)]
        agent: Option<String>,
    },
    /// From an agent child: start a memory worker with a self-contained
    /// instruction (answered at once; it runs in the background).
    #[serde(rename = "worker.start")]
    WorkerStart { instruction: String },
    /// From an agent child: delegate a search of past conversations to a
    /// recall sub-agent that sees the caller's conversation (read-only) and
    /// answer with its findings once it has finished.
    #[serde(rename = "recall.delegate")]
    RecallDelegate { query: String },
    /// From an agent child running a reflection's integration (the
    /// explicit merge mode): merge that reflection's branch into `main`.
    /// Only the branch the supervisor is integrating, only from the
    /// conversation it started for it.
    #[serde(rename = "memory.merge")]
    MemoryMerge { branch: String },
    /// From an agent child, after a sync conflict: set the local commits
    /// aside, have a repair worker re-apply them onto the remote's memory,
    /// check that it did and sync (`memory.sync` with `repair`, for the
    /// child's own agent and the supervisor's remote). Answered when done.
    #[serde(rename = "memory.repair")]
    MemoryRepair {},
    /// In a cluster: give back an agent this host owns (its owner key is
    /// deleted), so another host may take it at once.
    #[serde(rename = "agent.release")]
    AgentRelease {
        #[serde(default)]
        agent: Option<String>,
    },
    /// Sync an agent's memory with its remote (`MINI_LETTA_REMOTE_ROOT`):
    /// fetch, fast-forward or rebase (backup ref first), validate, push;
    /// never force. Under the agent's memory lease.
    #[serde(rename = "memory.sync")]
    MemorySync {
        #[serde(default)]
        agent: Option<String>,
        /// The remote root as the caller sees it (`MINI_LETTA_REMOTE_ROOT`);
        /// the supervisor's own setting when absent.
        #[serde(default)]
        remote_root: Option<String>,
        /// After a `conflict`, set the local commits aside and queue a
        /// repair worker that re-applies them onto the remote's memory.
        #[serde(default)]
        repair: bool,
    },
}

/// Parameters of `reflect.run`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReflectParams {
    /// Agent id or name; the only agent when absent.
    #[serde(default)]
    pub agent: Option<String>,
    /// `auto` (the supervisor merges) or `explicit` (the agent's own
    /// integration reviews and merges); the agent's setting when absent.
    #[serde(default)]
    pub mode: Option<String>,
    /// Extra guidance for this reflection.
    #[serde(default)]
    pub instruction: Option<String>,
    /// Answer when the reflection has finished (merged or not).
    #[serde(default)]
    pub wait: bool,
    /// The reflection's context window (`MINI_LETTA_REFLECTION_CONTEXT_WINDOW`
    /// as the caller saw it).
    #[serde(default)]
    pub context_window: Option<u64>,
    /// Isolation of the reflection's child (`strict` when absent).
    #[serde(default)]
    pub isolation: Option<String>,
}

impl Call {
    /// The method name this call travels under (a row of `METHODS`).
    pub fn method(&self) -> &'static str {
        match self {
            Call::Ping {} => "ping",
            Call::Status {} => "supervisor.status",
            Call::Stop {} => "supervisor.stop",
            Call::Ps {} => "ps",
            Call::Spawn(_) => "child.spawn",
            Call::Kill { .. } => "child.kill",
            Call::ChildTimings { .. } => "child.timings",
            Call::Subscribe {} => "events.subscribe",
            Call::MemoryCommit { .. } => "memory.commit",
            Call::MemoryLease { .. } => "memory.lease",
            Call::MemoryRelease {} => "memory.release",
            Call::MemoryStatus { .. } => "memory.status",
            Call::ModelComplete { .. } => "model.complete",
            Call::ModelInfo { .. } => "model.info",
            Call::TurnRun(_) => "turn.run",
            Call::TurnCancel { .. } => "turn.cancel",
            Call::TurnEvent { .. } => "turn.event",
            Call::Log { .. } => "log",
            Call::TaskGet {} => "task.get",
            Call::TaskFinish { .. } => "task.finish",
            Call::ReflectRun(_) => "reflect.run",
            Call::ReflectStatus { .. } => "reflect.status",
            Call::WorkerStart { .. } => "worker.start",
            Call::RecallDelegate { .. } => "recall.delegate",
            Call::MemoryMerge { .. } => "memory.merge",
            Call::MemoryRepair {} => "memory.repair",
            Call::MemorySync { .. } => "memory.sync",
            Call::AgentRelease { .. } => "agent.release",
        }
    }
}

/// The result of `memory.commit`: the new commit (none when the paths did
/// not change) and the paths it changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    pub commit: Option<String>,
    #[serde(default)]
    pub changed: Vec<String>,
}

/// Log levels a child may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// How a child's standard streams are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StdioMode {
    /// `/dev/null` in, output to the supervisor's log.
    #[default]
    Null,
    /// The three descriptors sent with the request.
    Passed,
}

/// Parameters of `child.spawn`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpawnParams {
    pub agent: String,
    pub role: String,
    /// Program and arguments run inside the child.
    pub argv: Vec<String>,
    #[serde(default)]
    pub stdio: StdioMode,
    /// Working directory: the agent's directory when absent.
    #[serde(default)]
    pub workspace: Option<String>,
    /// Isolation level requested (`strict`, `degraded`, `off`).
    #[serde(default)]
    pub isolation: Option<String>,
    /// The model this child's `model.complete` calls use (the agent's
    /// recorded model when absent). Recorded at launch: the child cannot
    /// name another one later.
    #[serde(default)]
    pub model: Option<String>,
}

/// Parameters of `turn.run`. The program the child runs is the
/// supervisor's choice (the installed agent-side program), never the
/// caller's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnParams {
    /// Agent id or name; the only agent when absent.
    #[serde(default)]
    pub agent: Option<String>,
    /// A project directory the agent may read and write.
    #[serde(default)]
    pub workspace: Option<String>,
    /// Isolation level (`strict` when absent, `degraded`, `off`).
    #[serde(default)]
    pub isolation: Option<String>,
    /// The model the child's `model.complete` calls use (the agent's
    /// recorded model when absent).
    #[serde(default)]
    pub model: Option<String>,
    /// The conversation the turn belongs to: one turn runs at a time per
    /// conversation (a second one waits for the first).
    #[serde(default = "default_conversation")]
    pub conversation: String,
    /// `MINI_LETTA_CONTEXT_WINDOW` as the caller saw it (a reflection the
    /// turn triggers falls back to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// `MINI_LETTA_REFLECTION_CONTEXT_WINDOW` as the caller saw it: the
    /// window of a reflection this turn triggers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reflection_context_window: Option<u64>,
    /// In a cluster: wait this many seconds for another host's ownership
    /// of the agent to end (`chat --wait-owner`) instead of being refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_owner_secs: Option<u64>,
    /// `chat --timings`: the answer carries the supervisor's marks of this
    /// turn (`timings`, see `protocol::timings`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timings: bool,
}

fn default_conversation() -> String {
    "default".into()
}

/// A frame sent by the supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    Hello {
        version: u32,
        server: String,
        pid: u32,
    },
    Response {
        id: u64,
        #[serde(flatten)]
        outcome: Outcome,
    },
    /// Unsolicited: `{"type":"event","event":NAME,"data":{...}}`.
    Event(Event),
    /// A frame that could not be handled; `id` when the request had one.
    Error {
        id: Option<u64>,
        code: ErrorCode,
        message: String,
    },
}

/// A response's result or error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Result(Value),
    Error(ErrorBody),
}

/// The error of a failed request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    /// Extra structured detail (e.g. validator violations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// Machine-readable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidJson,
    InvalidFrame,
    FrameTooLarge,
    UnknownMethod,
    InvalidParams,
    VersionMismatch,
    HelloRequired,
    Forbidden,
    NotFound,
    ValidationFailed,
    Unavailable,
    /// Read by a supervisor that is draining (an embedded one whose command
    /// is done): not started, safe to send again to the next supervisor.
    NotTaken,
    NotImplemented,
    Internal,
}

/// Why a line could not be decoded into a [`ClientFrame`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FrameError {
    pub id: Option<u64>,
    pub code: ErrorCode,
    pub message: String,
}

impl FrameError {
    fn new(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            id,
            code,
            message: message.into(),
        }
    }

    /// The `error` frame that answers this failure.
    pub fn to_frame(&self) -> ServerFrame {
        ServerFrame::Error {
            id: self.id,
            code: self.code,
            message: self.message.clone(),
        }
    }
}

/// Method names the supervisor understands.
pub const METHODS: &[&str] = &[
    "ping",
    "supervisor.status",
    "supervisor.stop",
    "ps",
    "child.spawn",
    "child.kill",
    "child.timings",
    "events.subscribe",
    "memory.commit",
    "memory.lease",
    "memory.release",
    "memory.status",
    "model.complete",
    "model.info",
    "turn.run",
    "turn.cancel",
    "turn.event",
    "log",
    "task.get",
    "task.finish",
    "reflect.run",
    "reflect.status",
    "worker.start",
    "recall.delegate",
    "memory.merge",
    "memory.sync",
    "memory.repair",
    "agent.release",
];

/// Decode one line (without its newline) into a client frame, telling apart
/// invalid JSON, a malformed frame, an unknown method and bad parameters.
pub fn decode_client(line: &[u8]) -> Result<ClientFrame, FrameError> {
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| FrameError::new(None, ErrorCode::InvalidJson, format!("invalid JSON: {e}")))?;
    let Some(obj) = value.as_object() else {
        return Err(FrameError::new(
            None,
            ErrorCode::InvalidFrame,
            "a frame must be a JSON object",
        ));
    };
    let id = obj.get("id").and_then(Value::as_u64);
    match obj.get("type").and_then(Value::as_str) {
        Some("hello") => serde_json::from_value(value.clone()).map_err(|e| {
            FrameError::new(
                None,
                ErrorCode::InvalidFrame,
                format!("invalid hello frame: {e}"),
            )
        }),
        Some("request") => {
            let Some(id) = id else {
                return Err(FrameError::new(
                    None,
                    ErrorCode::InvalidFrame,
                    "a request needs a non-negative integer \"id\"",
                ));
            };
            let method = obj.get("method").and_then(Value::as_str).unwrap_or("");
            if !METHODS.contains(&method) {
                return Err(FrameError::new(
                    Some(id),
                    ErrorCode::UnknownMethod,
                    format!("unknown method {method:?}"),
                ));
            }
            // A missing `params` means "no arguments".
            let mut value = value.clone();
            if let Some(o) = value.as_object_mut() {
                o.entry("params")
                    .or_insert_with(|| Value::Object(Default::default()));
            }
            serde_json::from_value(value).map_err(|e| {
                FrameError::new(
                    Some(id),
                    ErrorCode::InvalidParams,
                    format!("invalid params for {method}: {e}"),
                )
            })
        }
        Some(other) => Err(FrameError::new(
            id,
            ErrorCode::InvalidFrame,
            format!("unknown frame type {other:?}"),
        )),
        None => Err(FrameError::new(
            id,
            ErrorCode::InvalidFrame,
            "a frame needs a string \"type\"",
        )),
    }
}

/// Encode a frame as one line, newline included.
pub fn encode<T: Serialize>(frame: &T) -> Vec<u8> {
    // Serialising these plain data types cannot fail; fall back to an error
    // frame's text rather than panic if it ever did.
    let mut line = serde_json::to_vec(frame).unwrap_or_else(|e| {
        format!("{{\"type\":\"error\",\"id\":null,\"code\":\"internal\",\"message\":\"encode failed: {e}\"}}")
            .into_bytes()
    });
    line.push(b'\n');
    line
}

/// Splits a byte stream into lines, enforcing [`MAX_FRAME_BYTES`]: an
/// over-long line is dropped up to its newline and reported once.
#[derive(Debug, Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
    discarding: bool,
}

/// One item out of a [`LineSplitter`].
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Frame(Vec<u8>),
    /// A line over [`MAX_FRAME_BYTES`], dropped; `id` is the request id its
    /// head named, so the answer reaches the request that waits for it.
    TooLarge {
        id: Option<u64>,
    },
}

/// How much of an oversized line's head is searched for its id: a frame
/// is encoded `{"type":"request","id":N,…`, the id before any payload.
const ID_SEARCH_BYTES: usize = 128;

/// The request id at the head of an (oversized) frame line, if it names one.
pub(crate) fn id_in_head(head: &[u8]) -> Option<u64> {
    let head = &head[..head.len().min(ID_SEARCH_BYTES)];
    let key = b"\"id\":";
    let at = head.windows(key.len()).position(|w| w == key)? + key.len();
    let digits: Vec<u8> = head[at..]
        .iter()
        .skip_while(|b| **b == b' ')
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

impl LineSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether part of a line is buffered, waiting for its end.
    pub fn is_pending(&self) -> bool {
        !self.buf.is_empty() || self.discarding
    }

    /// The id of the line overflowing now: its head is what is buffered,
    /// continued by `next`.
    fn overflow_id(&self, next: &[u8]) -> Option<u64> {
        let mut head = self.buf[..self.buf.len().min(ID_SEARCH_BYTES)].to_vec();
        head.extend_from_slice(&next[..next.len().min(ID_SEARCH_BYTES)]);
        id_in_head(&head)
    }

    /// Feed bytes; returns the complete lines found.
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<Line> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            match bytes.iter().position(|&b| b == b'\n') {
                Some(nl) => {
                    let (head, rest) = bytes.split_at(nl);
                    bytes = &rest[1..];
                    if self.discarding {
                        self.discarding = false;
                        self.buf.clear();
                        continue;
                    }
                    if self.buf.len() + head.len() > MAX_FRAME_BYTES {
                        let id = self.overflow_id(head);
                        self.buf.clear();
                        out.push(Line::TooLarge { id });
                        continue;
                    }
                    self.buf.extend_from_slice(head);
                    let line = std::mem::take(&mut self.buf);
                    // Blank lines (keep-alives, stray CRLF) are not frames.
                    if !line.iter().all(|b| b.is_ascii_whitespace()) {
                        out.push(Line::Frame(line));
                    }
                }
                None => {
                    if !self.discarding {
                        if self.buf.len() + bytes.len() > MAX_FRAME_BYTES {
                            let id = self.overflow_id(bytes);
                            self.buf.clear();
                            self.discarding = true;
                            out.push(Line::TooLarge { id });
                        } else {
                            self.buf.extend_from_slice(bytes);
                        }
                    }
                    bytes = &[];
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let f = ClientFrame::Request {
            id: 7,
            call: Call::MemoryCommit {
                paths: vec!["human.md".into()],
                message: "m".into(),
                agent: None,
            },
        };
        let line = encode(&f);
        let text = String::from_utf8(line.clone()).unwrap();
        assert!(text.contains("\"method\":\"memory.commit\""), "{text}");
        assert_eq!(decode_client(line.strip_suffix(b"\n").unwrap()).unwrap(), f);
    }

    #[test]
    fn missing_params_means_none() {
        let f = decode_client(br#"{"type":"request","id":1,"method":"ping"}"#).unwrap();
        assert_eq!(
            f,
            ClientFrame::Request {
                id: 1,
                call: Call::Ping {}
            }
        );
    }

    #[test]
    fn errors_are_classified() {
        let code = |l: &[u8]| decode_client(l).unwrap_err().code;
        assert_eq!(code(b"{nope"), ErrorCode::InvalidJson);
        assert_eq!(code(b"[1]"), ErrorCode::InvalidFrame);
        assert_eq!(
            code(br#"{"type":"request","method":"ping"}"#),
            ErrorCode::InvalidFrame
        );
        assert_eq!(
            code(br#"{"type":"request","id":3,"method":"rm -rf"}"#),
            ErrorCode::UnknownMethod
        );
        let e = decode_client(
            br#"{"type":"request","id":3,"method":"memory.commit","params":{"paths":1}}"#,
        )
        .unwrap_err();
        assert_eq!((e.id, e.code), (Some(3), ErrorCode::InvalidParams));
    }

    #[test]
    fn splitter_handles_partial_and_oversized_lines() {
        let mut s = LineSplitter::new();
        assert!(s.push(b"{\"a\":").is_empty());
        assert_eq!(
            s.push(b"1}\n\n{}\n"),
            vec![
                Line::Frame(b"{\"a\":1}".to_vec()),
                Line::Frame(b"{}".to_vec())
            ]
        );
        let big = vec![b'x'; MAX_FRAME_BYTES + 1];
        assert_eq!(s.push(&big), vec![Line::TooLarge { id: None }]);
        assert!(s.push(b"more junk").is_empty());
        assert_eq!(s.push(b"tail\n{}\n"), vec![Line::Frame(b"{}".to_vec())]);
    }

    /// Issue 43 §5: an oversized request is answered with its id, however
    /// its bytes arrive (its head buffered, in one piece, or cut anywhere).
    #[test]
    fn an_oversized_request_keeps_its_id() {
        let mut line = encode(&ClientFrame::Request {
            id: 4711,
            call: Call::MemoryCommit {
                paths: vec!["x".repeat(MAX_FRAME_BYTES)],
                message: "m".into(),
                agent: None,
            },
        });
        line.extend_from_slice(b"{}\n");
        for cut in [0, 5, 17, 40, 1000, MAX_FRAME_BYTES - 10, line.len() - 4] {
            let mut s = LineSplitter::new();
            let mut got = s.push(&line[..cut]);
            got.extend(s.push(&line[cut..]));
            assert_eq!(
                got,
                vec![
                    Line::TooLarge { id: Some(4711) },
                    Line::Frame(b"{}".to_vec())
                ],
                "cut at {cut}"
            );
        }
        assert_eq!(id_in_head(b"{\"type\":\"request\",\"id\": 9,"), Some(9));
        assert_eq!(id_in_head(b"{\"type\":\"request\",\"call\":{}"), None);
        assert_eq!(id_in_head(b"{\"id\":99999999999999999999999}"), None);
    }
}
