//! A blocking client of the protocol: used by the CLI on the control socket
//! and by children on their inherited channel. Blocking (no async runtime)
//! because children must stay single-threaded for confinement.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use serde_json::Value;

use super::events::{ChildExit, Event};
use super::messages::{ModelFailure, ModelRequest, ModelResponse};
use super::{
    CHANNEL_FD_ENV, Call, ClientFrame, Committed, ErrorBody, ErrorCode, Line, LineSplitter,
    Outcome, PROTOCOL_VERSION, PeerKind, ServerFrame, encode,
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the supervisor at {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("supervisor connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the supervisor closed the connection")]
    Closed,
    #[error("supervisor sent an unreadable frame: {0}")]
    BadFrame(String),
    #[error("{}", .0.message)]
    Remote(ErrorBody),
    #[error("supervisor protocol version {theirs} differs from ours ({PROTOCOL_VERSION})")]
    Version { theirs: u32 },
    #[error(
        "no channel: {CHANNEL_FD_ENV} is not set (this command runs inside a mini-letta child)"
    )]
    NoChannel,
}

impl ClientError {
    /// The remote error code, when the supervisor answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Remote(b) => Some(b.code),
            _ => None,
        }
    }
}

/// A connection speaking the protocol.
pub struct Client {
    stream: UnixStream,
    splitter: LineSplitter,
    pending: std::collections::VecDeque<Vec<u8>>,
    next_id: u64,
    /// Server pid from its hello.
    pub server_pid: u32,
}

impl Client {
    /// Connect to a control socket and exchange hellos.
    pub fn connect(socket: &Path) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
        Self::handshake(stream, PeerKind::Cli)
    }

    /// Use the channel a supervisor gave this process (from [`CHANNEL_FD_ENV`]).
    pub fn from_channel_env() -> Result<Self, ClientError> {
        let fd: RawFd = std::env::var(CHANNEL_FD_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or(ClientError::NoChannel)?;
        // The descriptor must be an open socket; fstat guards against a stale
        // variable naming some unrelated descriptor.
        // SAFETY: borrowed only for the checks below; an fd that is not
        // open fails the fstat, and a non-socket is refused.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let st = nix::sys::stat::fstat(borrowed).map_err(|e| ClientError::Io(e.into()))?;
        let kind = nix::sys::stat::SFlag::from_bits_truncate(st.st_mode);
        if kind & nix::sys::stat::SFlag::S_IFMT != nix::sys::stat::SFlag::S_IFSOCK {
            return Err(ClientError::NoChannel);
        }
        // dup so that dropping this client leaves the inherited fd open for
        // the next caller in the same process tree.
        let owned = borrowed.try_clone_to_owned()?;
        Self::handshake(UnixStream::from(owned), PeerKind::Child)
    }

    /// Like [`Self::from_channel_env`], but this process takes the channel
    /// for itself: the inherited descriptor is marked close-on-exec, so no
    /// program this process runs (a tool command) inherits it. The agent
    /// child uses this: its tools must never reach the model proxy.
    pub fn take_channel_env() -> Result<Self, ClientError> {
        let client = Self::from_channel_env()?;
        let fd: RawFd = std::env::var(CHANNEL_FD_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or(ClientError::NoChannel)?;
        // SAFETY: from_channel_env just checked that `fd` is an open socket
        // of ours; only its descriptor flags change.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        nix::fcntl::fcntl(
            borrowed,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|e| ClientError::Io(e.into()))?;
        Ok(client)
    }

    /// Wrap an already-connected stream (e.g. one end of a socketpair).
    pub fn handshake(stream: UnixStream, peer: PeerKind) -> Result<Self, ClientError> {
        let mut c = Self {
            stream,
            splitter: LineSplitter::new(),
            pending: Default::default(),
            next_id: 1,
            server_pid: 0,
        };
        c.send(&ClientFrame::Hello {
            version: PROTOCOL_VERSION,
            peer,
        })?;
        loop {
            match c.read_frame()? {
                ServerFrame::Hello { version, pid, .. } => {
                    if version != PROTOCOL_VERSION {
                        return Err(ClientError::Version { theirs: version });
                    }
                    c.server_pid = pid;
                    return Ok(c);
                }
                ServerFrame::Error { code, message, .. } => {
                    return Err(ClientError::Remote(ErrorBody {
                        code,
                        message,
                        data: None,
                    }));
                }
                _ => continue,
            }
        }
    }

    pub fn set_timeout(&self, t: Option<Duration>) -> Result<(), ClientError> {
        self.stream.set_read_timeout(t)?;
        Ok(())
    }

    fn send(&mut self, frame: &ClientFrame) -> Result<(), ClientError> {
        self.stream.write_all(&encode(frame))?;
        Ok(())
    }

    /// Send a request; returns its id.
    pub fn send_request(&mut self, call: Call) -> Result<u64, ClientError> {
        self.send_request_with_fds(call, &[])
    }

    /// Send a request with descriptors attached (`SCM_RIGHTS`).
    pub fn send_request_with_fds(&mut self, call: Call, fds: &[RawFd]) -> Result<u64, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let line = encode(&ClientFrame::Request { id, call });
        if fds.is_empty() {
            self.stream.write_all(&line)?;
        } else {
            // The descriptors ride on the first byte of the frame.
            let iov = [std::io::IoSlice::new(&line[..1])];
            let cmsg = [ControlMessage::ScmRights(fds)];
            sendmsg::<()>(
                self.stream.as_raw_fd(),
                &iov,
                &cmsg,
                MsgFlags::empty(),
                None,
            )
            .map_err(|e| ClientError::Io(e.into()))?;
            self.stream.write_all(&line[1..])?;
        }
        Ok(id)
    }

    /// The next frame from the server.
    pub fn read_frame(&mut self) -> Result<ServerFrame, ClientError> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                return serde_json::from_slice(&line).map_err(|e| {
                    ClientError::BadFrame(format!("{e}: {}", String::from_utf8_lossy(&line)))
                });
            }
            let mut buf = [0u8; 16 * 1024];
            let n = self.stream.read(&mut buf)?;
            if n == 0 {
                return Err(ClientError::Closed);
            }
            for line in self.splitter.push(&buf[..n]) {
                match line {
                    Line::Frame(f) => self.pending.push_back(f),
                    Line::TooLarge => return Err(ClientError::BadFrame("frame too large".into())),
                }
            }
        }
    }

    /// Wait for the response to `id`, passing the events that arrive
    /// meanwhile to `on_event`.
    pub fn wait_response_with(
        &mut self,
        id: u64,
        mut on_event: impl FnMut(&Event),
    ) -> Result<Value, ClientError> {
        loop {
            match self.read_frame()? {
                ServerFrame::Response { id: rid, outcome } if rid == id => {
                    return match outcome {
                        Outcome::Result(v) => Ok(v),
                        Outcome::Error(e) => Err(ClientError::Remote(e)),
                    };
                }
                ServerFrame::Error {
                    id: Some(rid),
                    code,
                    message,
                } if rid == id => {
                    return Err(ClientError::Remote(ErrorBody {
                        code,
                        message,
                        data: None,
                    }));
                }
                ServerFrame::Event(event) => on_event(&event),
                _ => {}
            }
        }
    }

    /// Wait for the response to `id`, keeping the `child.exit` events that
    /// arrive meanwhile in `exits` (a short-lived child's exit may come
    /// before its spawn response), for [`Self::wait_exit`].
    pub fn wait_response_keeping_exits(
        &mut self,
        id: u64,
        exits: &mut Vec<ChildExit>,
    ) -> Result<Value, ClientError> {
        self.wait_response_with(id, |e| {
            if let Event::ChildExit(x) = e {
                exits.push(x.clone());
            }
        })
    }

    /// Wait for the `child.exit` event of `child` (on a subscribed
    /// connection). `seen` holds exit events that arrived earlier, e.g.
    /// while waiting for the spawn response; others read meanwhile are kept.
    pub fn wait_exit(
        &mut self,
        child: u64,
        seen: &mut Vec<ChildExit>,
    ) -> Result<ChildExit, ClientError> {
        loop {
            if let Some(pos) = seen.iter().position(|e| e.child == child) {
                return Ok(seen.remove(pos));
            }
            if let ServerFrame::Event(Event::ChildExit(exit)) = self.read_frame()? {
                seen.push(exit);
            }
        }
    }

    /// `model.complete`: ask the supervisor for a model response, passing
    /// the text deltas streamed for it to `on_delta`. A failure is the
    /// model error the supervisor sent, or a fatal one naming why the call
    /// itself failed.
    pub fn model_complete(
        &mut self,
        request: &ModelRequest,
        mut on_delta: impl FnMut(&str),
    ) -> Result<ModelResponse, ModelFailure> {
        let request = serde_json::to_value(request)
            .map_err(|e| ModelFailure::fatal(format!("unwritable model request: {e}")))?;
        let id = self
            .send_request(Call::ModelComplete { request })
            .map_err(|e| ModelFailure::fatal(format!("cannot reach the supervisor: {e}")))?;
        let result = self.wait_response_with(id, |e| {
            if let Event::ModelDelta(d) = e
                && d.request == id
            {
                on_delta(&d.text);
            }
        });
        match result {
            Ok(v) => serde_json::from_value(v)
                .map_err(|e| ModelFailure::fatal(format!("unreadable model response: {e}"))),
            Err(ClientError::Remote(body)) => Err(body
                .data
                .and_then(|d| serde_json::from_value::<ModelFailure>(d).ok())
                .unwrap_or_else(|| ModelFailure::fatal(body.message))),
            Err(e) => Err(ModelFailure::fatal(format!("supervisor channel: {e}"))),
        }
    }

    /// `model.info` of the caller's own model (a child) or of `model` (a
    /// CLI): the context window the supervisor's configuration gives it,
    /// if any.
    pub fn model_context_window(
        &mut self,
        model: Option<&str>,
    ) -> Result<Option<u64>, ClientError> {
        let v = self.call(Call::ModelInfo {
            model: model.map(str::to_string),
        })?;
        Ok(v.get("context_window").and_then(Value::as_u64))
    }

    /// `memory.commit` of `paths` of the caller's own memory checkout.
    pub fn memory_commit(
        &mut self,
        paths: Vec<String>,
        message: String,
    ) -> Result<Committed, ClientError> {
        let v = self.call(Call::MemoryCommit {
            paths,
            message,
            agent: None,
        })?;
        serde_json::from_value(v)
            .map_err(|e| ClientError::BadFrame(format!("unreadable memory.commit result: {e}")))
    }

    /// Send a request and wait for its result, ignoring events.
    pub fn call(&mut self, call: Call) -> Result<Value, ClientError> {
        let id = self.send_request(call)?;
        self.wait_response_with(id, |_| {})
    }

    /// Write raw bytes (tests of malformed frames).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    pub fn into_stream(self) -> UnixStream {
        self.stream
    }
}
