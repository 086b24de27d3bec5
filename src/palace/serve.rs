//! `palace serve`: the pages over HTTP on loopback (unless told otherwise),
//! read-only: only `GET` and `HEAD` are answered (405 for anything else),
//! every parameter is checked before use, and a Content-Security-Policy
//! that allows no script backs up the escaping.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

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
pub fn router(site: Site) -> Router {
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

/// Serve until Ctrl-C or SIGTERM; `ready` gets the bound address first.
pub async fn serve(
    site: Site,
    addr: SocketAddr,
    ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = listen(addr)?;
    ready(listener.local_addr()?);
    let stop = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
        }
    };
    axum::serve(listener, router(site))
        .with_graceful_shutdown(stop)
        .await
}
