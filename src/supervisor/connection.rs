//! One peer's protocol loop, shared by CLI connections and child channels:
//! read frames under backpressure, answer `hello`, refuse what the peer's
//! role may not send, and hand requests to [`super::dispatch`].

use std::sync::Arc;

use serde_json::json;
use tokio::sync::broadcast;

use super::dispatch::{handle, refuse_by_policy};
use super::frames_io::{FrameReader, FrameSender};
use super::state::{Peer, State};
use crate::protocol::events::Lagged;
use crate::protocol::{
    Call, ClientFrame, ErrorCode, Event, FrameError, Line, Outcome, PROTOCOL_VERSION, PeerKind,
    ServerFrame, StdioMode, decode_client,
};

/// Requests of one connection handled at the same time.
pub const MAX_INFLIGHT_PER_CONNECTION: usize = 64;

/// The protocol loop. Boxed: a request handler may start a child whose
/// channel runs this same loop.
pub fn serve_frames(
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
    let mut greeted = matches!(peer, Peer::Child { .. });
    let mut subscription: Option<tokio::task::JoinHandle<()>> = None;
    let inflight = Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT_PER_CONNECTION));
    // Cancelled when this peer goes away: its turns have nobody to answer.
    let conn = super::state::Connection {
        id: state.connection_id(),
        gone: tokio_util::sync::CancellationToken::new(),
    };
    let _gone_on_exit = conn.gone.clone().drop_guard();
    // Set once the supervisor drains (CLI peers only): what is in flight
    // is answered, anything new is refused as not taken, and the peer is
    // still read so that its going away is noticed (its turns stopped).
    let mut draining = false;
    loop {
        // Backpressure: no new request is read while this peer's answers
        // pile up unread; one that never reads is cut off.
        if !sender.room().await {
            report_cut_off(&peer, &sender);
            break;
        }
        let next = tokio::select! {
            next = reader.next() => next,
            _ = sender.cut_off() => {
                report_cut_off(&peer, &sender);
                break;
            }
            // Until the supervisor is gone the peer is read (a request
            // refused as not taken is one it may safely send again).
            _ = state.drain.cancelled(), if matches!(peer, Peer::Cli) && !draining => {
                draining = true;
                continue;
            }
        };
        let next = match next {
            Ok(Some(n)) => n,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!("connection read error: {e}");
                break;
            }
        };
        let (line, fds, refused) = next;
        let frame = match line {
            Line::TooLarge => Err(FrameError {
                id: None,
                code: ErrorCode::FrameTooLarge,
                message: format!("frame exceeds {} bytes", crate::protocol::MAX_FRAME_BYTES),
            }),
            Line::Frame(bytes) => decode_client(&bytes),
        };
        if refused > 0 {
            // Already closed by the reader; the frame they came with is
            // refused (answered with its id when it had one).
            if let Peer::Child {
                id, agent, role, ..
            } = &peer
            {
                tracing::warn!(child = id, agent = %agent, role = %role, descriptors = refused, "closed descriptors a child tried to pass");
            }
            let id = match &frame {
                Ok(ClientFrame::Request { id, .. }) => Some(*id),
                Ok(_) => None,
                Err(e) => e.id,
            };
            sender.send(&ServerFrame::Error {
                id,
                code: ErrorCode::Forbidden,
                message: format!(
                    "children may not pass descriptors: {refused} closed, the frame they came with refused"
                ),
            });
            continue;
        }
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                sender.send(&e.to_frame());
                continue;
            }
        };
        match frame {
            ClientFrame::Hello {
                version,
                peer: said,
            } => {
                if version != PROTOCOL_VERSION {
                    sender.send(&ServerFrame::Error {
                        id: None,
                        code: ErrorCode::VersionMismatch,
                        message: format!("protocol version {version} is not supported (this supervisor speaks {PROTOCOL_VERSION})"),
                    });
                    continue;
                }
                if let Peer::Child { id, .. } = &peer {
                    if let Ok(mut t) = state.table.lock() {
                        t.mark_running(*id);
                    }
                } else if said == PeerKind::Child {
                    tracing::debug!(
                        "a control-socket peer called itself a child; treated as a CLI"
                    );
                }
                greeted = true;
                sender.send(&ServerFrame::Hello {
                    version: PROTOCOL_VERSION,
                    server: format!("mini-letta {}", env!("CARGO_PKG_VERSION")),
                    pid: std::process::id(),
                });
            }
            ClientFrame::Request { id, call } => {
                if matches!(peer, Peer::Cli) {
                    state
                        .cli_requests
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                if draining && !matches!(call, Call::TurnCancel { .. }) {
                    sender.send(&ServerFrame::Error {
                        id: Some(id),
                        code: ErrorCode::NotTaken,
                        message: "the supervisor is stopping and took nothing new: send the request again (the next supervisor will take it)".into(),
                    });
                    continue;
                }
                if !greeted {
                    sender.send(&ServerFrame::Error {
                        id: Some(id),
                        code: ErrorCode::HelloRequired,
                        message: "send hello with the protocol version first".into(),
                    });
                    continue;
                }
                if matches!(call, Call::Subscribe {}) {
                    // Events name every agent's children: not for children.
                    if let Some(refused) = refuse_by_policy(&peer, &call) {
                        sender.send(&ServerFrame::Response {
                            id,
                            outcome: refused,
                        });
                        continue;
                    }
                    if subscription.is_none() {
                        subscription = Some(forward_events(state.clone(), sender.clone()));
                    }
                    sender.send(&ServerFrame::Response {
                        id,
                        outcome: Outcome::Result(json!({ "subscribed": true })),
                    });
                    continue;
                }
                // Descriptors belong to the frame they came with; any other
                // frame's are closed here (by dropping them).
                let fds = match &call {
                    Call::Spawn(p) if p.stdio == StdioMode::Passed => {
                        fds.into_iter().take(3).collect()
                    }
                    Call::TurnRun(_) => fds.into_iter().take(3).collect(),
                    _ => Vec::new(),
                };
                // At most this many requests of one connection run at once:
                // past it we stop reading (the peer waits, nobody else does).
                let permit = tokio::select! {
                    p = inflight.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = sender.cut_off() => {
                        report_cut_off(&peer, &sender);
                        break;
                    }
                };
                let st = state.clone();
                let sender = sender.clone();
                let peer = peer.clone();
                let conn = conn.clone();
                // Tracked: shutdown lets running requests (commits) finish.
                state.requests.spawn(async move {
                    let _permit = permit;
                    let state = st;
                    let outcome = handle(&state, &peer, id, call, fds, &sender, &conn).await;
                    sender.send(&ServerFrame::Response { id, outcome });
                });
            }
        }
    }
    if let Some(s) = subscription {
        s.abort();
    }
    // A CLI's memory lease ends with its connection.
    if matches!(peer, Peer::Cli) {
        state
            .leases
            .release(super::leases::Holder::Connection(conn.id));
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
