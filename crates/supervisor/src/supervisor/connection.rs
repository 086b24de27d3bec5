//! One peer's protocol loop, shared by CLI connections and child channels:
//! read frames under backpressure, answer `hello`, refuse what the peer's
//! role may not send, and hand requests to [`super::dispatch`].

use std::ops::ControlFlow;
use std::sync::Arc;

use tokio::sync::broadcast;

use super::dispatch::{handle, refuse_by_policy};
use super::frames_io::{FrameReader, FrameSender, PassedFds};
use super::state::{Connection, Peer, State};
use crate::protocol::events::Lagged;
use crate::protocol::replies;
use crate::protocol::timings;
use crate::protocol::{
    Call, ClientFrame, ErrorCode, Event, FrameError, Line, Outcome, PROTOCOL_VERSION, PeerKind,
    ServerFrame, StdioMode, decode_client,
};

/// Requests of one connection handled at the same time.
pub const MAX_INFLIGHT_PER_CONNECTION: usize = 64;

/// The protocol loop. Boxed: a request handler may start a child whose
/// channel runs this same loop.
pub(crate) fn serve_frames(
    state: Arc<State>,
    reader: FrameReader,
    sender: FrameSender,
    peer: Peer,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(serve_frames_inner(state, reader, sender, peer))
}

async fn serve_frames_inner(
    state: Arc<State>,
    mut reader: FrameReader,
    sender: FrameSender,
    peer: Peer,
) {
    let mut this = PeerLoop::new(state, sender, peer);
    let _gone_on_exit = this.conn.gone.clone().drop_guard();
    loop {
        let (line, fds, refused) = match this.read(&mut reader).await {
            Read::Frame(line, fds, refused) => (line, fds, refused),
            Read::Again => continue,
            Read::Closed => break,
        };
        // A child's stage reports its marks with its hello (see
        // `timings::hello_with_marks`).
        let stage_marks = match (&line, &this.peer) {
            (Line::Frame(bytes), Peer::Child { .. }) => timings::marks_in_hello(bytes),
            _ => Vec::new(),
        };
        let Some(frame) = this.decode(line, refused) else {
            continue;
        };
        match frame {
            ClientFrame::Hello {
                version,
                peer: said,
                key,
            } => this.hello(version, said, key.as_deref(), stage_marks),
            ClientFrame::Request { id, call } => {
                if this.request(id, call, fds).await.is_break() {
                    break;
                }
            }
        }
    }
    this.finish();
}

/// What a frame read brought.
enum Read {
    /// A frame line, the descriptors that came with it, and how many more
    /// were refused (already closed).
    Frame(Line, PassedFds, usize),
    /// Nothing yet: read again.
    Again,
    /// The peer is gone or cut off.
    Closed,
}

/// One peer's loop: what it keeps between frames.
struct PeerLoop {
    state: Arc<State>,
    sender: FrameSender,
    peer: Peer,
    /// Cancelled when this peer goes away: its turns have nobody to answer.
    conn: Connection,
    inflight: Arc<tokio::sync::Semaphore>,
    greeted: bool,
    /// Set once the supervisor drains (CLI peers only): what is in flight
    /// is answered, anything new is refused as not taken, and the peer is
    /// still read so that its going away is noticed (its turns stopped).
    draining: bool,
    subscription: Option<tokio::task::JoinHandle<()>>,
}

impl PeerLoop {
    fn new(state: Arc<State>, sender: FrameSender, peer: Peer) -> Self {
        let conn = Connection {
            id: state.connection_id(),
            gone: tokio_util::sync::CancellationToken::new(),
        };
        PeerLoop {
            greeted: matches!(peer, Peer::Child { .. }),
            inflight: Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT_PER_CONNECTION)),
            state,
            sender,
            peer,
            conn,
            draining: false,
            subscription: None,
        }
    }

    /// The next frame, once the peer has room for answers.
    async fn read(&mut self, reader: &mut FrameReader) -> Read {
        // Backpressure: no new request is read while this peer's answers
        // pile up unread; one that never reads is cut off.
        if !self.sender.room().await {
            report_cut_off(&self.peer, &self.sender);
            return Read::Closed;
        }
        let next = tokio::select! {
            next = reader.next() => next,
            _ = self.sender.cut_off() => {
                report_cut_off(&self.peer, &self.sender);
                return Read::Closed;
            }
            // Until the supervisor is gone the peer is read (a request
            // refused as not taken is one it may safely send again).
            _ = self.state.drain.cancelled(), if matches!(self.peer, Peer::Cli) && !self.draining => {
                self.draining = true;
                return Read::Again;
            }
        };
        match next {
            Ok(Some((line, fds, refused))) => Read::Frame(line, fds, refused),
            Ok(None) => Read::Closed,
            Err(e) => {
                tracing::debug!("connection read error: {e}");
                Read::Closed
            }
        }
    }

    /// The frame a line holds; `None` when it was answered here already
    /// (too large, undecodable, or with descriptors a child may not pass).
    fn decode(&self, line: Line, refused: usize) -> Option<ClientFrame> {
        let frame = match line {
            Line::TooLarge { id } => Err(FrameError {
                id,
                code: ErrorCode::FrameTooLarge,
                message: format!(
                    "the request exceeds the {} MiB a frame may carry, and was dropped",
                    crate::protocol::MAX_FRAME_BYTES / (1024 * 1024)
                ),
            }),
            Line::Frame(bytes) => decode_client(&bytes),
        };
        if refused > 0 {
            self.refuse_descriptors(&frame, refused);
            return None;
        }
        match frame {
            Ok(f) => Some(f),
            Err(e) => {
                self.sender.send(&e.to_frame());
                None
            }
        }
    }

    /// Descriptors a child tried to pass are already closed by the reader;
    /// the frame they came with is refused (answered with its id when it
    /// had one).
    fn refuse_descriptors(&self, frame: &Result<ClientFrame, FrameError>, refused: usize) {
        if let Peer::Child {
            id, agent, role, ..
        } = &self.peer
        {
            tracing::warn!(child = id, agent = %agent, role = %role, descriptors = refused, "closed descriptors a child tried to pass");
        }
        let id = match frame {
            Ok(ClientFrame::Request { id, .. }) => Some(*id),
            Ok(_) => None,
            Err(e) => e.id,
        };
        self.sender.send(&ServerFrame::Error {
            id,
            code: ErrorCode::Forbidden,
            message: format!(
                "children may not pass descriptors: {refused} closed, the frame they came with refused"
            ),
        });
    }

    /// `hello`: the protocol version checked, a child marked running.
    fn hello(
        &mut self,
        version: u32,
        said: PeerKind,
        key: Option<&str>,
        stage_marks: Vec<timings::Mark>,
    ) {
        if version != PROTOCOL_VERSION {
            self.sender.send(&ServerFrame::Error {
                id: None,
                code: ErrorCode::VersionMismatch,
                message: format!("protocol version {version} is not supported (this supervisor speaks {PROTOCOL_VERSION})"),
            });
            return;
        }
        if matches!(self.peer, Peer::Cli) && !self.state.control_key.admits(key) {
            tracing::warn!("a control connection without this supervisor's key was refused");
            self.sender.send(&ServerFrame::Error {
                id: None,
                code: ErrorCode::Forbidden,
                message: super::control_key::REFUSAL.to_string(),
            });
            return;
        }
        if let Peer::Child { id, .. } = &self.peer {
            if let Ok(mut t) = self.state.table.lock() {
                t.mark_running(*id);
                t.mark_once(*id, "sup.child_hello");
                t.add_reported_marks(*id, stage_marks);
            }
        } else if said == PeerKind::Child {
            tracing::debug!("a control-socket peer called itself a child; treated as a CLI");
        }
        self.greeted = true;
        self.sender.send(&ServerFrame::Hello {
            version: PROTOCOL_VERSION,
            server: format!("mini-letta {}", env!("CARGO_PKG_VERSION")),
            pid: std::process::id(),
        });
    }

    /// A request: admitted, then answered here (`subscribe`) or handed to
    /// [`handle`] as a task of its own. `Break`: stop reading this peer.
    async fn request(&mut self, id: u64, call: Call, fds: PassedFds) -> ControlFlow<()> {
        if !self.admit(id, &call) {
            return ControlFlow::Continue(());
        }
        if matches!(call, Call::Subscribe {}) {
            self.subscribe(id, &call);
            return ControlFlow::Continue(());
        }
        // Descriptors belong to the frame they came with; any other
        // frame's are closed here (by dropping them).
        let fds = match &call {
            Call::Spawn(p) if p.stdio == StdioMode::Passed => fds.into_iter().take(3).collect(),
            Call::TurnRun(_) => fds.into_iter().take(3).collect(),
            _ => Vec::new(),
        };
        // At most this many requests of one connection run at once:
        // past it we stop reading (the peer waits, nobody else does).
        let permit = tokio::select! {
            p = self.inflight.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return ControlFlow::Break(()),
            },
            _ = self.sender.cut_off() => {
                report_cut_off(&self.peer, &self.sender);
                return ControlFlow::Break(());
            }
        };
        let state = self.state.clone();
        let sender = self.sender.clone();
        let peer = self.peer.clone();
        let conn = self.conn.clone();
        // Tracked: shutdown lets running requests (commits) finish.
        self.state.requests.spawn(async move {
            let _permit = permit;
            let outcome = handle(&state, &peer, id, call, fds, &sender, &conn).await;
            sender.send(&ServerFrame::Response { id, outcome });
        });
        ControlFlow::Continue(())
    }

    /// Whether a request is taken: counted (CLI peers), refused as not
    /// taken while draining (all but cancels), refused before `hello`.
    fn admit(&self, id: u64, call: &Call) -> bool {
        if matches!(self.peer, Peer::Cli) {
            self.state
                .cli_requests
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if self.draining && !matches!(call, Call::TurnCancel { .. }) {
            self.sender.send(&ServerFrame::Error {
                id: Some(id),
                code: ErrorCode::NotTaken,
                message: "the supervisor is stopping and took nothing new: send the request again (the next supervisor will take it)".into(),
            });
            return false;
        }
        if !self.greeted {
            self.sender.send(&ServerFrame::Error {
                id: Some(id),
                code: ErrorCode::HelloRequired,
                message: "send hello with the protocol version first".into(),
            });
            return false;
        }
        true
    }

    /// `subscribe`: this peer hears the supervisor's events from now on.
    fn subscribe(&mut self, id: u64, call: &Call) {
        // Events name every agent's children: not for children.
        if let Some(refused) = refuse_by_policy(&self.peer, call) {
            self.sender.send(&ServerFrame::Response {
                id,
                outcome: refused,
            });
            return;
        }
        if self.subscription.is_none() {
            self.subscription = Some(forward_events(self.state.clone(), self.sender.clone()));
        }
        self.sender.send(&ServerFrame::Response {
            id,
            outcome: Outcome::reply(&replies::Subscribed { subscribed: true }),
        });
    }

    /// The peer is gone: its subscription stops, a CLI's memory lease ends
    /// with its connection.
    fn finish(&mut self) {
        if let Some(s) = self.subscription.take() {
            s.abort();
        }
        if matches!(self.peer, Peer::Cli) {
            self.state
                .leases
                .release(super::leases::Holder::Connection(self.conn.id));
        }
    }
}

fn report_cut_off(peer: &Peer, sender: &FrameSender) {
    if !sender.overflowed() {
        return;
    }
    let limits = format!(
        "answers unread for {:?} or more than {} bytes queued",
        super::frames_io::MAX_STALL,
        super::frames_io::MAX_QUEUED_BYTES
    );
    match peer {
        Peer::Child {
            id, agent, role, ..
        } => tracing::warn!(
            child = id,
            agent = %agent,
            role = %role,
            "disconnected a child that does not read its responses ({limits})"
        ),
        Peer::Cli => {
            tracing::warn!("disconnected a control-socket peer that does not read ({limits})")
        }
    }
}

fn forward_events(state: Arc<State>, sender: FrameSender) -> tokio::task::JoinHandle<()> {
    let mut rx = state.events.subscribe();
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(event) => {
                    if !sender.send(&ServerFrame::Event(event)) {
                        break;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    sender.send(&ServerFrame::Event(Event::EventsLagged(Lagged {
                        missed: n,
                    })));
                }
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    })
}
