//! A blocking client of the protocol: used by the CLI on the control socket
//! and by children on their inherited channel. Blocking (no async runtime)
//! because children must stay single-threaded for confinement, and a short
//! CLI command should not pay for starting one.
//!
//! The socket is an `interprocess` local-socket stream. That crate has no
//! descriptor passing, so the one request that carries descriptors
//! (`turn.run` with the child's stdio, see [`Client::send_request_with_fds`])
//! goes out through nix's `sendmsg` on the same socket.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use interprocess::local_socket::traits::Stream as _;
use interprocess::local_socket::{GenericFilePath, Stream, ToFsName};
use interprocess::os::unix::uds_local_socket;
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use serde::de::DeserializeOwned;
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
    stream: Stream,
    splitter: LineSplitter,
    pending: std::collections::VecDeque<Vec<u8>>,
    next_id: u64,
    /// Server pid from its hello.
    pub server_pid: u32,
}

impl Client {
    /// Connect to a control socket and exchange hellos.
    pub fn connect(socket: &Path) -> Result<Self, ClientError> {
        let stream = socket
            .to_fs_name::<GenericFilePath>()
            .and_then(Stream::connect)
            .map_err(|source| ClientError::Connect {
                path: socket.display().to_string(),
                source,
            })?;
        // The key beside the socket, if this process may read it: only the
        // supervisor's user can, never one of its confined children.
        let key = std::fs::read_to_string(crate::paths::control_key_beside(socket))
            .ok()
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty() && k.len() <= 256);
        Self::start_with_key(stream, PeerKind::Cli, key)
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
        Self::start(stream_of(owned), PeerKind::Child)
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
        Self::start(stream_of(stream.into()), peer)
    }

    /// Exchange hellos on a connected stream.
    fn start(stream: Stream, peer: PeerKind) -> Result<Self, ClientError> {
        Self::start_with_key(stream, peer, None)
    }

    fn start_with_key(
        stream: Stream,
        peer: PeerKind,
        key: Option<String>,
    ) -> Result<Self, ClientError> {
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
            key,
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
        self.stream.set_recv_timeout(t)?;
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
                socket_fd(&self.stream).as_raw_fd(),
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
                    Line::TooLarge { .. } => {
                        return Err(ClientError::BadFrame("frame too large".into()));
                    }
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
            // Too large to reach the supervisor at all: for the turn's
            // ladder that is a request over the window (compact, trim,
            // cut the summariser's transcript), not a provider's fault.
            Err(ClientError::Remote(body)) if body.code == ErrorCode::FrameTooLarge => {
                Err(ModelFailure::ContextOverflow {
                    message: body.message,
                })
            }
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
        let info: super::replies::ModelInfo = self.call_as(Call::ModelInfo {
            model: model.map(str::to_string),
        })?;
        Ok(info.context_window)
    }

    /// `memory.commit` of `paths` of the caller's own memory checkout.
    pub fn memory_commit(
        &mut self,
        paths: Vec<String>,
        message: String,
    ) -> Result<Committed, ClientError> {
        self.call_as(Call::MemoryCommit {
            paths,
            message,
            agent: None,
        })
    }

    /// Send a request and read its result as the reply type `R`
    /// (`super::replies`), ignoring events.
    pub fn call_as<R: DeserializeOwned>(&mut self, call: Call) -> Result<R, ClientError> {
        let method = call.method();
        let v = self.call_json(call)?;
        decode_reply(method, v)
    }

    /// Wait for the response to `id` and read it as the reply type `R`,
    /// passing the events that arrive meanwhile to `on_event`.
    pub fn wait_reply_with<R: DeserializeOwned>(
        &mut self,
        id: u64,
        method: &str,
        on_event: impl FnMut(&Event),
    ) -> Result<R, ClientError> {
        let v = self.wait_response_with(id, on_event)?;
        decode_reply(method, v)
    }

    /// [`Self::wait_reply_with`], keeping the `child.exit` events that
    /// arrive meanwhile in `exits` (see [`Self::wait_response_keeping_exits`]).
    pub fn wait_reply_keeping_exits<R: DeserializeOwned>(
        &mut self,
        id: u64,
        method: &str,
        exits: &mut Vec<ChildExit>,
    ) -> Result<R, ClientError> {
        let v = self.wait_response_keeping_exits(id, exits)?;
        decode_reply(method, v)
    }

    /// Send a request and wait for its result as the JSON that came,
    /// ignoring events: for tests of the wire and for tools that print a
    /// reply whole. A program reads replies typed ([`Self::call_as`]).
    pub fn call_json(&mut self, call: Call) -> Result<Value, ClientError> {
        let id = self.send_request(call)?;
        self.wait_response_with(id, |_| {})
    }
}

/// A reply of `method` read as `R`; one that does not read is a bad frame
/// naming the method.
fn decode_reply<R: DeserializeOwned>(method: &str, v: Value) -> Result<R, ClientError> {
    super::replies::decode(v)
        .map_err(|e| ClientError::BadFrame(format!("unreadable {method} result: {e}")))
}

/// A connected Unix socket as a local-socket stream.
fn stream_of(fd: OwnedFd) -> Stream {
    Stream::from(uds_local_socket::Stream::from(fd))
}

/// The socket under `stream`, for the `sendmsg` interprocess cannot make.
fn socket_fd(stream: &Stream) -> BorrowedFd<'_> {
    // On Unix a local socket is always a Unix-domain socket.
    let Stream::UdSocket(s) = stream;
    s.as_fd()
}

#[cfg(test)]
mod tests {
    use std::io::{IoSliceMut, Read, Write};
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};
    use std::os::unix::net::{UnixListener, UnixStream};

    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

    use super::*;

    /// A reply that is not the method's type is a bad frame naming the
    /// method, never a panic or a default.
    #[test]
    fn a_reply_that_does_not_read_names_its_method() {
        let missing = serde_json::json!({"pid": 1, "agent": "a", "role": "tool"});
        let err = decode_reply::<crate::protocol::replies::Started>("child.spawn", missing)
            .expect_err("no child id");
        match err {
            ClientError::BadFrame(why) => {
                assert!(why.starts_with("unreadable child.spawn result"), "{why}");
                assert!(why.contains("child"), "{why}");
            }
            other => panic!("not a bad frame: {other:?}"),
        }
        let wrong_type = serde_json::json!({"pong": "yes"});
        assert!(matches!(
            decode_reply::<crate::protocol::replies::Pong>("ping", wrong_type),
            Err(ClientError::BadFrame(_))
        ));
        let ok = decode_reply::<crate::protocol::replies::Pong>(
            "ping",
            serde_json::json!({"pong": true}),
        );
        assert!(ok.expect("a pong").pong);
    }

    /// The server's side of a handshake on `peer`: read the client's hello
    /// line, answer with ours.
    fn answer_hello(peer: &mut UnixStream) {
        let mut byte = [0u8; 1];
        while peer.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {}
        let hello = ServerFrame::Hello {
            version: PROTOCOL_VERSION,
            server: "test".into(),
            pid: 4242,
        };
        peer.write_all(&encode(&hello)).unwrap();
    }

    #[test]
    fn connects_by_the_socket_path_and_handshakes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("supervisor.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut peer, _) = listener.accept().unwrap();
            answer_hello(&mut peer);
            // A request line arrives whole.
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while peer.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            line
        });
        let mut client = Client::connect(&path).unwrap();
        assert_eq!(client.server_pid, 4242);
        let id = client.send_request(Call::Ping {}).unwrap();
        let line = server.join().unwrap();
        let frame: ClientFrame = serde_json::from_slice(&line).unwrap();
        assert!(
            matches!(frame, ClientFrame::Request { id: rid, call: Call::Ping {} } if rid == id),
            "{}",
            String::from_utf8_lossy(&line)
        );
    }

    #[test]
    fn a_missing_socket_is_a_connect_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nobody-listens.sock");
        match Client::connect(&path) {
            Err(ClientError::Connect {
                path: named,
                source,
            }) => {
                assert_eq!(named, path.display().to_string());
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected a connect error, got {:?}", other.map(|_| ())),
        }
    }

    /// `chat` hands the child's stdio to `turn.run` this way: the
    /// descriptors arrive with the first byte of the request, the rest of
    /// the line after them.
    #[test]
    fn descriptors_ride_on_the_request() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            answer_hello(&mut theirs);
            let mut first = [0u8; 1];
            let mut cmsg = nix::cmsg_space!([RawFd; 3]);
            let fds: Vec<OwnedFd> = {
                let mut iov = [IoSliceMut::new(&mut first)];
                let msg = recvmsg::<()>(
                    theirs.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::empty(),
                )
                .unwrap();
                assert_eq!(msg.bytes, 1);
                let mut fds = Vec::new();
                for c in msg.cmsgs().unwrap() {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: SCM_RIGHTS just installed these in this
                        // process; nothing else owns them.
                        fds.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }),
                        );
                    }
                }
                fds
            };
            let mut rest = Vec::new();
            let mut byte = [0u8; 1];
            while theirs.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
                rest.push(byte[0]);
            }
            let mut line = first.to_vec();
            line.extend(rest);
            (fds, line)
        });
        let mut client = Client::handshake(ours, PeerKind::Cli).unwrap();
        let file = tempfile::tempfile().unwrap();
        let sent = [file.as_raw_fd(); 3];
        let id = client.send_request_with_fds(Call::Ping {}, &sent).unwrap();
        let (fds, line) = server.join().unwrap();
        assert_eq!(fds.len(), 3);
        let want = nix::sys::stat::fstat(file.as_fd()).unwrap();
        for fd in &fds {
            let got = nix::sys::stat::fstat(fd.as_fd()).unwrap();
            assert_eq!((got.st_dev, got.st_ino), (want.st_dev, want.st_ino));
        }
        let frame: ClientFrame = serde_json::from_slice(&line).unwrap();
        assert!(matches!(frame, ClientFrame::Request { id: rid, .. } if rid == id));
    }
}
