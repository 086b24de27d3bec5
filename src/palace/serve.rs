//! `palace serve`: the pages over HTTP on loopback (unless told otherwise),
//! read-only: only `GET` and `HEAD` are answered (405 for anything else),
//! every parameter is checked before use, and a Content-Security-Policy
//! that allows no script backs up the escaping. Connections are driven
//! here (hyper's HTTP/1.1 under a cap) so that a slow or silent client
//! costs a bounded time and a shutdown a bounded wait (see [`Limits`]).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use super::data::Site;
use super::pages::{self, Page};
use super::{PalaceError, check_sha};

type Shared = Arc<Site>;

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

fn failure(e: PalaceError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::warn!("palace: {e}");
    }
    html(status, pages::error(status.as_u16(), &e.to_string()))
}

/// Run `f` (git and file reads) off the async threads.
async fn render(
    site: Shared,
    f: impl FnOnce(&Site) -> Result<String, PalaceError> + Send + 'static,
) -> Response {
    match tokio::task::spawn_blocking(move || f(&site)).await {
        Ok(Ok(body)) => html(StatusCode::OK, body),
        Ok(Err(e)) => failure(e),
        Err(e) => failure(PalaceError::Internal(format!("page task failed: {e}"))),
    }
}

/// `<name>.html` → `<name>`, else a 404.
fn strip_html(file: &str) -> Result<&str, PalaceError> {
    file.strip_suffix(".html")
        .ok_or_else(|| PalaceError::NotFound(format!("{file}: no such page")))
}

async fn agents(State(site): State<Shared>) -> Response {
    render(site, |s| {
        Ok(pages::agents(&Page::at_depth(0, true), &s.agents()?))
    })
    .await
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        pages::STYLE,
    )
        .into_response()
}

async fn memory(State(site): State<Shared>, Path(id): Path<String>) -> Response {
    render(site, move |s| {
        Ok(pages::memory(&Page::at_depth(2, true), &s.memory(&id)?))
    })
    .await
}

async fn history(State(site): State<Shared>, Path(id): Path<String>) -> Response {
    // Up to 500 commits: rendered once per version of `main`.
    render(site, move |s| {
        let version = s.history_version(&id)?;
        let page = s.pages.get_or_render(&id, &version, || {
            Ok(pages::history(&Page::at_depth(2, true), &s.history(&id)?))
        })?;
        Ok(page.as_str().to_owned())
    })
    .await
}

async fn commit(State(site): State<Shared>, Path((id, file)): Path<(String, String)>) -> Response {
    render(site, move |s| {
        let sha = check_sha(strip_html(&file)?)?;
        Ok(pages::commit(
            &Page::at_depth(3, true),
            &s.commit(&id, sha)?,
        ))
    })
    .await
}

async fn file(
    State(site): State<Shared>,
    Path((id, path)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    render(site, move |s| {
        let path = strip_html(&path)?;
        let sha = q.get("sha").map(|v| check_sha(v)).transpose()?;
        let view = s.file(&id, path, sha)?;
        let depth = 3 + path.matches('/').count();
        Ok(pages::file(&Page::at_depth(depth, true), &view))
    })
    .await
}

async fn conversation(
    State(site): State<Shared>,
    Path((id, file)): Path<(String, String)>,
) -> Response {
    render(site, move |s| {
        let conv = strip_html(&file)?;
        Ok(pages::conversation(
            &Page::at_depth(3, true),
            &s.conversation(&id, conv)?,
        ))
    })
    .await
}

async fn search(
    State(site): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    render(site, move |s| {
        let query = q.get("q").cloned().unwrap_or_default();
        let (agent, hits) = s.search(&id, &query)?;
        Ok(pages::search(
            &Page::at_depth(2, true),
            &agent,
            &query,
            &hits,
        ))
    })
    .await
}

async fn not_found() -> Response {
    failure(PalaceError::NotFound("no such page".into()))
}

/// Read-only: anything but GET/HEAD is 405 whatever the path; every answer
/// carries headers that forbid scripts and sniffing.
async fn guard(req: Request, next: Next) -> Response {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = html(
            StatusCode::METHOD_NOT_ALLOWED,
            pages::error(405, "Palace is read-only: only GET and HEAD"),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// The router over `site`.
pub(crate) fn router(site: Site) -> Router {
    Router::new()
        .route("/", get(agents))
        .route("/index.html", get(agents))
        .route("/style.css", get(style))
        .route("/a/{id}/", get(memory))
        .route("/a/{id}/index.html", get(memory))
        .route("/a/{id}/history.html", get(history))
        .route("/a/{id}/commits/{file}", get(commit))
        .route("/a/{id}/files/{*path}", get(file))
        .route("/a/{id}/c/{file}", get(conversation))
        .route("/a/{id}/search.html", get(search))
        .fallback(not_found)
        .layer(middleware::from_fn(guard))
        .with_state(Arc::new(site))
}

/// Connections the kernel queues before Palace accepts them. A plain bind
/// gets 128: a burst of more clients than that (the load test's 200) lost
/// SYNs and waited out a one-second retransmit.
const ACCEPT_BACKLOG: u32 = 1024;

/// Connections served at once. Past it Palace accepts no more until one
/// ends (the rest wait in the backlog): above the load test's 200
/// clients, and far below the usual limit of 1,024 descriptors, which any
/// local user could otherwise exhaust.
const MAX_CONNECTIONS: usize = 256;
/// Time a client has to send a whole request header, from its connection
/// or the end of the previous response: a client that never finishes one
/// (or idles between requests) gives its connection back after this.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection with no request being rendered and no byte moved either
/// way for this long is closed (a client that stopped reading a response).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// At shutdown, how long requests in flight may finish before every
/// connection is dropped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The bounds a server runs under (the constants above; tests shrink them).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read: Duration,
    pub idle: Duration,
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            header_read: HEADER_READ_TIMEOUT,
            idle: IDLE_TIMEOUT,
            drain: DRAIN_TIMEOUT,
        }
    }
}

fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // A restarted Palace can take its port back from sockets in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

/// Serve `site` on `addr` until `stop` completes; `ready` gets the bound
/// address first.
pub async fn serve(
    site: Site,
    addr: SocketAddr,
    stop: impl Future<Output = ()>,
    ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = listen(addr)?;
    ready(listener.local_addr()?);
    run(listener, router(site), Limits::default(), stop).await;
    Ok(())
}

/// Accept connections on `listener` and serve `app` on each, within
/// `limits`, until `stop` completes; then stop accepting, let requests in
/// flight finish for at most `limits.drain`, and drop every connection.
pub async fn run(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (closing, closed) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(stop);
    loop {
        // A slot first: past the cap, clients wait in the kernel's queue.
        let slot = tokio::select! {
            () = &mut stop => break,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(s) => s,
                Err(_) => break, // never closed
            },
        };
        let stream = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, or an aborted handshake: go on
                    // after a pause rather than spin.
                    tracing::warn!("palace: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        while conns.try_join_next().is_some() {}
        conns.spawn(connection(
            stream,
            app.clone(),
            limits,
            closed.clone(),
            slot,
        ));
    }
    drop(listener);
    let _ = closing.send(true);
    let drained = tokio::time::timeout(limits.drain, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            "palace: {} connection(s) still open after {:?}; closed",
            conns.len(),
            limits.drain
        );
    }
    conns.abort_all();
}

/// One connection: HTTP/1.1 with a header-read timeout, closed when idle
/// (see [`IDLE_TIMEOUT`]), and shut down gracefully (the request in flight
/// finishes, nothing more is read) once `closing` changes. Holds its slot.
async fn connection(
    stream: tokio::net::TcpStream,
    app: Router,
    limits: Limits,
    mut closing: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: Arc::clone(&activity),
    });
    let app = TowerToHyperService::new(app);
    let busy = Arc::clone(&activity);
    let service = hyper::service::service_fn(move |req| {
        let rendering = Activity::busy(&busy);
        let response = hyper::service::Service::call(&app, req);
        async move {
            let r = response.await;
            drop(rendering);
            r
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!("palace: connection ended: {e}");
                }
                return;
            }
            _ = closing.changed(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            () = tokio::time::sleep_until(activity.next_check(limits.idle)) => {
                if activity.idle_for(limits.idle) {
                    tracing::debug!("palace: connection idle for {:?}; closed", limits.idle);
                    return;
                }
            }
        }
    }
}

/// When a connection last moved a byte or finished a request, and how
/// many of its requests are being rendered.
struct Activity {
    start: tokio::time::Instant,
    /// Milliseconds after `start`.
    last: AtomicU64,
    busy: AtomicUsize,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            last: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> tokio::time::Instant {
        self.start + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }

    /// A request being rendered, until the guard is dropped.
    fn busy(this: &Arc<Self>) -> Busy {
        this.busy.fetch_add(1, Ordering::Relaxed);
        Busy(Arc::clone(this))
    }

    /// When the connection could next have been idle for `idle`.
    fn next_check(&self, idle: Duration) -> tokio::time::Instant {
        if self.busy.load(Ordering::Relaxed) > 0 {
            tokio::time::Instant::now() + idle
        } else {
            self.last() + idle
        }
    }

    fn idle_for(&self, idle: Duration) -> bool {
        self.busy.load(Ordering::Relaxed) == 0 && self.last().elapsed() >= idle
    }
}

/// A request being rendered: the connection is not idle meanwhile.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that records when it last moved a byte.
struct Watched {
    inner: tokio::net::TcpStream,
    activity: Arc<Activity>,
}

impl Watched {
    fn moved<T>(&self, r: Poll<std::io::Result<T>>, bytes: bool) -> Poll<std::io::Result<T>> {
        if bytes && matches!(r, Poll::Ready(Ok(_))) {
            self.activity.touch();
        }
        r
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let moved = buf.filled().len() > before;
        self.moved(r, moved)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        let moved = matches!(r, Poll::Ready(Ok(n)) if n > 0);
        self.moved(r, moved)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        let moved = matches!(r, Poll::Ready(Ok(n)) if n > 0);
        self.moved(r, moved)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A server of `app` on a free loopback port, stopped when the sender
    /// is used or dropped.
    async fn start(
        app: Router,
        limits: Limits,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(run(listener, app, limits, async {
            let _ = stopped.await;
        }));
        (addr, stop, server)
    }

    fn limits(header_read_ms: u64, idle_ms: u64, drain_ms: u64) -> Limits {
        Limits {
            max_connections: 8,
            header_read: Duration::from_millis(header_read_ms),
            idle: Duration::from_millis(idle_ms),
            drain: Duration::from_millis(drain_ms),
        }
    }

    fn test_app() -> Router {
        Router::new()
            .route("/", get(|| async { "hello" }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    "done"
                }),
            )
            .route("/big", get(|| async { vec![b'x'; 64 << 20] }))
    }

    async fn send(addr: SocketAddr, request: &[u8]) -> TcpStream {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        s
    }

    /// Everything the server sends until it closes; `None` if it is still
    /// open after `within`.
    async fn until_closed(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        let mut got = Vec::new();
        tokio::time::timeout(within, async {
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await
        .ok()
        .map(|()| got)
    }

    const GET_SLOW: &[u8] = b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    const PARTIAL: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n";

    #[tokio::test]
    async fn a_client_that_stops_reading_is_closed_when_idle_but_a_slow_page_is_not() {
        let (addr, _stop, _server) = start(test_app(), limits(10_000, 300, 100)).await;
        // Rendering for twice the idle time is not idleness.
        let mut slow = send(addr, GET_SLOW).await;
        let got = until_closed(&mut slow, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&got).ends_with("done"));
        // A request whose 64 MiB answer is never read: the writes stall,
        // and the connection is dropped once nothing moved for 300 ms.
        let mut stalled = send(addr, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n").await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let got = until_closed(&mut stalled, Duration::from_secs(3))
            .await
            .expect("a stalled connection is still open");
        assert!(got.len() < 64 << 20, "the whole answer was sent");
    }

    #[tokio::test]
    async fn past_the_cap_a_client_waits_until_a_connection_ends() {
        let mut l = limits(30_000, 30_000, 100);
        l.max_connections = 2;
        let (addr, _stop, _server) = start(test_app(), l).await;
        let first = send(addr, PARTIAL).await;
        let _second = send(addr, PARTIAL).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut third = send(
            addr,
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        let mut buf = [0u8; 16];
        let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut buf)).await;
        assert!(early.is_err(), "served past the cap");
        drop(first);
        let got = until_closed(&mut third, Duration::from_secs(5))
            .await
            .unwrap();
        // The early read timed out having read nothing.
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.1 200") && text.ends_with("hello"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_stop_lets_the_request_in_flight_finish_then_drops_the_rest() {
        // Header and idle timeouts far off: only the drain bound ends the
        // silent client.
        let (addr, stop, server) = start(test_app(), limits(60_000, 60_000, 1500)).await;
        let mut silent = send(addr, PARTIAL).await;
        let mut slow = send(addr, GET_SLOW).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stopped_at = tokio::time::Instant::now();
        stop.send(()).unwrap();
        let got = until_closed(&mut slow, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&got).ends_with("done"));
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server did not stop")
            .unwrap();
        let took = stopped_at.elapsed();
        assert!(
            took >= Duration::from_millis(1400) && took < Duration::from_secs(3),
            "stopped after {took:?}"
        );
        assert!(
            until_closed(&mut silent, Duration::from_secs(1))
                .await
                .is_some()
        );
        // Nothing listens any more.
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
