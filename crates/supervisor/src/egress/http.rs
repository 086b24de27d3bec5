//! The little of HTTP/1.1 the proxy speaks: read a request head (bounded
//! in size), parse a forward-proxy request (`CONNECT host:port`, or an
//! absolute-form `http://` URL), write the head sent on to the server,
//! and the proxy's own answers. Everything here is strict: whatever is
//! not plainly one of those requests is refused, never guessed at.

use tokio::io::{AsyncRead, AsyncReadExt};

use super::allow::{Host, port, split_host_port};

/// The largest request head accepted (request line and headers).
pub const MAX_HEAD: usize = 32 * 1024;
/// Headers accepted at most.
const MAX_HEADERS: usize = 100;

/// A refusal the proxy answers with: status, phrase, one-line reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: String,
}

impl Refusal {
    pub fn new(status: u16, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
        }
    }

    fn bad(reason: impl Into<String>) -> Self {
        Self::new(400, reason)
    }

    /// The whole answer: status line, a plain-text body of one line.
    pub fn response(&self) -> Vec<u8> {
        let body = format!("mini-letta egress: {}\n", self.reason);
        format!(
            "HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.status,
            phrase(self.status),
            body.len()
        )
        .into_bytes()
    }
}

fn phrase(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// The answer to a `CONNECT` that was let through.
pub const TUNNEL_OPEN: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// Why no head could be read.
#[derive(Debug)]
pub enum HeadError {
    /// Larger than [`MAX_HEAD`].
    TooLarge,
    /// The client closed (or failed) before a whole head.
    Closed,
}

/// Read up to the end of a request head (`\r\n\r\n`): the head, and any
/// bytes read past it (the start of a body or of tunnelled data).
pub async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<(Vec<u8>, Vec<u8>), HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = r.read(&mut chunk).await.map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        let searched = buf.len().saturating_sub(3);
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if let Some(at) = find(&buf[searched..], b"\r\n\r\n") {
            let end = searched + at + 4;
            if end > max {
                return Err(HeadError::TooLarge);
            }
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > max {
            return Err(HeadError::TooLarge);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `CONNECT host:port`: a tunnel.
    Connect { host: Host, port: u16 },
    /// `METHOD http://host[:port]/path`: one request forwarded.
    Http {
        host: Host,
        port: u16,
        /// The origin-form target sent on (`/path?query`).
        path: String,
    },
}

impl Target {
    pub fn host(&self) -> &Host {
        match self {
            Target::Connect { host, .. } | Target::Http { host, .. } => host,
        }
    }

    pub fn port(&self) -> u16 {
        match self {
            Target::Connect { port, .. } | Target::Http { port, .. } => *port,
        }
    }
}

/// A parsed forward-proxy request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub target: Target,
    /// `HTTP/1.0` or `HTTP/1.1`.
    pub version: String,
    pub headers: Vec<(String, String)>,
}

/// What could be read of a request line before it was refused: enough to
/// record the attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Partial {
    pub method: String,
    pub host: Option<Host>,
    pub port: Option<u16>,
}

/// Parse a request head. A refusal carries what was understood so far.
///
/// httparse (hyper's parser) reads the structure; on top of it the proxy
/// is stricter than HTTP requires, since a head two readers would split
/// differently is how requests are smuggled: no bare LF, an upper-case
/// method, a visible target, header values of visible ASCII and tabs.
pub fn parse(head: &[u8]) -> Result<Request, (Refusal, Partial)> {
    let mut partial = Partial::default();
    let refuse = |why: &str, partial: &Partial| (Refusal::bad(why), partial.clone());
    if std::str::from_utf8(head).is_err() {
        return Err(refuse("malformed request: not ASCII", &partial));
    }
    let bare_lf = head
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || head.get(i - 1) != Some(&b'\r')));
    if bare_lf {
        return Err(refuse(
            "malformed request: a line ends without CR",
            &partial,
        ));
    }
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut slots);
    match parsed.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        Ok(_) => return Err(refuse("malformed request: an incomplete head", &partial)),
        Err(httparse::Error::TooManyHeaders) => {
            return Err((
                Refusal::new(431, format!("more than {MAX_HEADERS} headers")),
                partial,
            ));
        }
        Err(httparse::Error::HeaderName | httparse::Error::HeaderValue) => {
            return Err(refuse("malformed header line", &partial));
        }
        Err(_) => return Err(refuse("malformed request line", &partial)),
    }
    let (Some(method), Some(target), Some(minor)) = (parsed.method, parsed.path, parsed.version)
    else {
        return Err(refuse("malformed request line", &partial));
    };
    let token = method.len() <= 16 && method.bytes().all(|b| b.is_ascii_uppercase() || b == b'-');
    let visible = !target.is_empty() && target.bytes().all(|b| b.is_ascii_graphic());
    if !token || !visible {
        return Err(refuse("malformed request line", &partial));
    }
    let version = if minor == 0 { "HTTP/1.0" } else { "HTTP/1.1" };
    partial.method = method.to_string();
    let target = if method == "CONNECT" {
        connect_target(target)
    } else {
        http_target(target)
    };
    let target = target.map_err(|(r, host, port)| {
        partial.host = host;
        partial.port = port;
        (r, partial.clone())
    })?;
    partial.host = Some(target.host().clone());
    partial.port = Some(target.port());
    let headers = headers(parsed.headers).map_err(|r| (r, partial.clone()))?;
    Ok(Request {
        method: method.to_string(),
        target,
        version: version.to_string(),
        headers,
    })
}

type TargetError = (Refusal, Option<Host>, Option<u16>);

/// `host:port` of a `CONNECT` (a port is required).
fn connect_target(authority: &str) -> Result<Target, TargetError> {
    let (host_text, port_text) =
        split_host_port(authority).map_err(|e| (Refusal::bad(e), None, None))?;
    let host = Host::parse(host_text).map_err(|e| (Refusal::bad(e), None, None))?;
    let port_text = port_text.ok_or_else(|| {
        (
            Refusal::bad("CONNECT needs host:port"),
            Some(host.clone()),
            None,
        )
    })?;
    let port = port(port_text).map_err(|e| (Refusal::bad(e), Some(host.clone()), None))?;
    Ok(Target::Connect { host, port })
}

/// `http://host[:port]/path` (absolute form, as a proxy is sent).
fn http_target(url: &str) -> Result<Target, TargetError> {
    let Some(rest) = strip_prefix_ignore_case(url, "http://") else {
        let why = if strip_prefix_ignore_case(url, "https://").is_some() {
            "https:// goes through CONNECT (the proxy never sees its plaintext)"
        } else {
            "not a proxy request: the target must be an absolute http:// URL"
        };
        return Err((Refusal::bad(why), None, None));
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains('@') {
        return Err((
            Refusal::bad("a URL with user information is refused"),
            None,
            None,
        ));
    }
    let (host_text, port_text) =
        split_host_port(authority).map_err(|e| (Refusal::bad(e), None, None))?;
    let host = Host::parse(host_text).map_err(|e| (Refusal::bad(e), None, None))?;
    let port = match port_text {
        Some(p) => port(p).map_err(|e| (Refusal::bad(e), Some(host.clone()), None))?,
        None => 80,
    };
    let path = match path.split('#').next().unwrap_or("") {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    Ok(Target::Http { host, port, path })
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| s.get(prefix.len()..))
        .flatten()
}

/// The headers httparse found, held to visible ASCII and tabs.
fn headers(parsed: &[httparse::Header<'_>]) -> Result<Vec<(String, String)>, Refusal> {
    let mut out = Vec::with_capacity(parsed.len());
    for h in parsed {
        let value = std::str::from_utf8(h.value)
            .ok()
            .filter(|v| v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)))
            .ok_or_else(|| Refusal::bad("malformed header line"))?;
        out.push((
            h.name.to_string(),
            value.trim_matches([' ', '\t']).to_string(),
        ));
    }
    let lengths: Vec<&str> = values(&out, "content-length").collect();
    if values(&out, "transfer-encoding").next().is_some() && !lengths.is_empty() {
        return Err(Refusal::bad("both Content-Length and Transfer-Encoding"));
    }
    if lengths.windows(2).any(|w| w[0] != w[1]) {
        return Err(Refusal::bad("conflicting Content-Length headers"));
    }
    Ok(out)
}

fn values<'a>(headers: &'a [(String, String)], name: &'a str) -> impl Iterator<Item = &'a str> {
    headers
        .iter()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Headers that concern only the hop to the proxy, never sent on.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
];

/// The head sent to the server for an absolute-form request: origin-form
/// target, `Host` from the URL (never the client's header), hop-by-hop
/// headers dropped, and `Connection: close` (one request per connection:
/// nothing later on it can aim at another host).
pub(crate) fn forward_head(req: &Request) -> Vec<u8> {
    let Target::Http { host, port, path } = &req.target else {
        return Vec::new();
    };
    let named: Vec<String> = values(&req.headers, "connection")
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    let authority = if *port == 80 {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    let mut out = format!(
        "{} {path} {}\r\nHost: {authority}\r\n",
        req.method, req.version
    );
    for (name, value) in &req.headers {
        let lower = name.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&lower.as_str()) || named.contains(&lower) {
            continue;
        }
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(head: &str) -> Result<Request, (Refusal, Partial)> {
        parse(head.as_bytes())
    }

    #[test]
    fn proxy_requests_parse() {
        let r = req("GET http://Example.org:8080/a?b=1 HTTP/1.1\r\nHost: evil.org\r\nAccept: */*\r\nProxy-Connection: keep-alive\r\nConnection: x-drop\r\nX-Drop: 1\r\n\r\n").unwrap();
        assert_eq!(
            r.target,
            Target::Http {
                host: Host::Name("example.org".into()),
                port: 8080,
                path: "/a?b=1".into()
            }
        );
        let fwd = String::from_utf8(forward_head(&r)).unwrap();
        assert_eq!(
            fwd,
            "GET /a?b=1 HTTP/1.1\r\nHost: example.org:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let r = req("CONNECT [::1]:443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(
            r.target,
            Target::Connect {
                host: Host::Ip("::1".parse().unwrap()),
                port: 443
            }
        );
        let r = req("HEAD http://a.org HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(r.target.port(), 80);
        assert_eq!(
            String::from_utf8(forward_head(&r)).unwrap(),
            "HEAD / HTTP/1.0\r\nHost: a.org\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn anything_else_is_refused_with_what_was_understood() {
        for (head, status) in [
            ("NONSENSE\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\n\r\n", 400),
            ("GET https://a.org/ HTTP/1.1\r\n\r\n", 400),
            ("GET http://a.org@b.org/ HTTP/1.1\r\n\r\n", 400),
            ("GET http://127.1/ HTTP/1.1\r\n\r\n", 400),
            ("CONNECT a.org HTTP/1.1\r\n\r\n", 400),
            ("CONNECT a.org:0 HTTP/1.1\r\n\r\n", 400),
            ("GET http://a.org/ HTTP/2\r\n\r\n", 400),
            ("get http://a.org/ HTTP/1.1\r\n\r\n", 400),
            ("GET  http://a.org/ HTTP/1.1\r\n\r\n", 400),
            ("GET http://a.org/ HTTP/1.1\r\n folded\r\n\r\n", 400),
            ("GET http://a.org/ HTTP/1.1\r\nX: a\u{1b}b\r\n\r\n", 400),
            // Lines two readers would split differently: a bare LF, a
            // space before the colon, a NUL, a tab for a space.
            ("GET http://a.org/ HTTP/1.1\nX: y\r\n\r\n", 400),
            (
                "GET http://a.org/ HTTP/1.1\r\nX: y\nHost: b.org\r\n\r\n",
                400,
            ),
            ("GET http://a.org/ HTTP/1.1\r\nX : y\r\n\r\n", 400),
            ("GET http://a.org/ HTTP/1.1\r\nX: a\u{0}b\r\n\r\n", 400),
            ("GET\thttp://a.org/ HTTP/1.1\r\n\r\n", 400),
            ("GET http://a.org/ HTTP/1.1 \r\n\r\n", 400),
            ("GET http://a.org/ HTTP/1.1\r\n: empty-name\r\n\r\n", 400),
            ("GET http://a.org/ HTTP/1.1\r\nX: caf\u{e9}\r\n\r\n", 400),
            (
                "POST http://a.org/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                400,
            ),
            (
                "POST http://a.org/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                400,
            ),
        ] {
            let (r, _) = req(head).unwrap_err();
            assert_eq!(r.status, status, "{head:?}: {r:?}");
        }
        let (_, partial) = req("CONNECT a.org:0 HTTP/1.1\r\n\r\n").unwrap_err();
        assert_eq!(partial.method, "CONNECT");
        assert_eq!(partial.host, Some(Host::Name("a.org".into())));
        let many = format!(
            "GET http://a.org/ HTTP/1.1\r\n{}\r\n",
            "X: y\r\n".repeat(200)
        );
        assert_eq!(req(&many).unwrap_err().0.status, 431);
    }

    #[tokio::test]
    async fn heads_are_read_whole_and_bounded() {
        let mut input: &[u8] = b"GET http://a.org/ HTTP/1.1\r\nA: b\r\n\r\nBODY";
        let (head, rest) = read_head(&mut input, MAX_HEAD).await.unwrap();
        assert!(head.ends_with(b"\r\n\r\n"));
        assert_eq!(rest, b"BODY");
        let big = [
            b"GET http://a.org/ HTTP/1.1\r\nX: ".as_slice(),
            &vec![b'a'; 1 << 20],
        ]
        .concat();
        let mut input: &[u8] = &big;
        assert!(matches!(
            read_head(&mut input, MAX_HEAD).await,
            Err(HeadError::TooLarge)
        ));
        let mut input: &[u8] = b"GET http://a.org/";
        assert!(matches!(
            read_head(&mut input, MAX_HEAD).await,
            Err(HeadError::Closed)
        ));
        let body = String::from_utf8(Refusal::new(403, "nope").response()).unwrap();
        assert!(
            body.starts_with("HTTP/1.1 403 Forbidden\r\n")
                && body.ends_with("\r\n\r\nmini-letta egress: nope\n")
        );
    }
}
