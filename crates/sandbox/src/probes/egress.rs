//! The egress path (issue 34, rows 68–71): no way out but the
//! supervisor's proxy, the proxy letting through only what the agent's
//! list names, and no name resolution inside. The verify run gives the
//! attacker a list naming one host listener (`egress_listed`) and runs a
//! second one it does not name (`host_tcp_port`).
//!
//! Traffic stays on the host: the listeners are on its loopback, the
//! proxy is the supervisor, and a DNS query is sent only to a loopback
//! name server or one no route covers (for `.invalid`, which a resolver
//! answers itself).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use super::context::ProbeContext;
use super::util::{io_name, join, route_to};
use super::verdict::Verdict;

const TIMEOUT: Duration = Duration::from_secs(5);

/// One exchange with the proxy: the status line of its answer and
/// whether `marker` came back.
fn through_proxy(port: u16, request: &str, marker: &str) -> Result<(String, bool), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)
        .map_err(|e| format!("connect to the proxy {addr}: {}", io_name(&e)))?;
    let _ = s.set_read_timeout(Some(TIMEOUT));
    s.write_all(request.as_bytes())
        .map_err(|e| format!("write: {}", io_name(&e)))?;
    let mut answer = Vec::new();
    let _ = s.take(64 * 1024).read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let status = text.lines().next().unwrap_or("").to_string();
    Ok((status, !marker.is_empty() && text.contains(marker)))
}

/// Direct TCP connections to `port` on the loopback addresses.
fn direct(port: u16) -> Result<Vec<String>, String> {
    let mut refused = Vec::new();
    for ip in [
        IpAddr::from(Ipv4Addr::LOCALHOST),
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ] {
        let addr = SocketAddr::new(ip, port);
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(_) => return Err(format!("connected to {addr} directly")),
            Err(e) => refused.push(format!("{addr}: {}", io_name(&e))),
        }
    }
    Ok(refused)
}

/// Row 68: the namespace has no route, and the listed host's port is not
/// reachable without the proxy. Escaped if a direct connection is made.
pub(crate) fn no_route(ctx: &ProbeContext) -> Verdict {
    let routes = std::fs::read_to_string("/proc/net/route")
        .map(|t| t.lines().skip(1).filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0);
    let port = ctx
        .egress
        .as_ref()
        .map_or(ctx.host_tcp_port, |e| e.listed_port);
    match direct(port) {
        Err(e) => Verdict::escaped(e),
        Ok(refused) => Verdict::blocked(format!(
            "{routes} IPv4 route(s); direct connect to the listed port: {}",
            join(&refused)
        )),
    }
}

/// Row 69: the listed host answers through the proxy, and only there.
/// Escaped if it answers directly; skipped when the proxy is absent or
/// does not serve it.
pub(crate) fn listed_host(ctx: &ProbeContext) -> Verdict {
    let Some(e) = &ctx.egress else {
        return Verdict::skipped("this child has no egress proxy (its role's network is none)");
    };
    let (proxy, port, marker) = (e.proxy_port, e.listed_port, e.marker.as_str());
    if let Err(e) = direct(port) {
        return Verdict::escaped(e);
    }
    let req =
        format!("GET http://localhost:{port}/verify HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n");
    match through_proxy(proxy, &req, marker) {
        Ok((status, true)) if status.contains(" 200 ") => Verdict::blocked(format!(
            "reached localhost:{port} only through the proxy ({status}); directly: refused"
        )),
        Ok((status, _)) => Verdict::skipped(format!(
            "the proxy did not serve the listed host: {status:?}"
        )),
        Err(e) => Verdict::skipped(e),
    }
}

/// Row 70: hosts the list does not name, through the proxy: the same
/// loopback by IP, another port by name, a tunnel. Escaped if any gets
/// through.
pub(crate) fn refused_host(ctx: &ProbeContext) -> Verdict {
    let Some(e) = &ctx.egress else {
        return Verdict::skipped("this child has no egress proxy (its role's network is none)");
    };
    let (proxy, p, listed) = (e.proxy_port, ctx.host_tcp_port, e.listed_port);
    let tries = [
        format!("GET http://localhost:{p}/ HTTP/1.1\r\n\r\n"),
        format!("GET http://127.0.0.1:{listed}/ HTTP/1.1\r\n\r\n"),
        format!("CONNECT 127.0.0.1:{p} HTTP/1.1\r\n\r\n"),
        format!("CONNECT localhost:{p} HTTP/1.1\r\n\r\n"),
        "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n".to_string(),
    ];
    let mut seen = Vec::new();
    for req in &tries {
        let line = req.lines().next().unwrap_or("");
        match through_proxy(proxy, req, "") {
            Ok((status, _)) if status.contains(" 403 ") => seen.push(format!("{line}: 403")),
            Ok((status, _)) => return Verdict::escaped(format!("{line}: {status:?}")),
            Err(e) => return Verdict::skipped(e),
        }
    }
    Verdict::blocked(join(&seen))
}

/// The name servers of `/etc/resolv.conf`, and the usual local ones.
fn name_servers() -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    for local in [Ipv4Addr::new(127, 0, 0, 53), Ipv4Addr::LOCALHOST] {
        if !v.contains(&IpAddr::V4(local)) {
            v.push(IpAddr::V4(local));
        }
    }
    v
}

/// A DNS query for `mini-letta-verify.invalid` (type A).
const QUERY: &[u8] = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x11mini-letta-verify\x07invalid\x00\x00\x01\x00\x01";

/// Row 71: DNS from inside answers nothing, over UDP or TCP. Escaped if a
/// name server answers.
pub fn dns(_ctx: &ProbeContext) -> Verdict {
    let mut seen = Vec::new();
    for server in name_servers() {
        let off_host = match server {
            IpAddr::V4(a) if !a.is_loopback() => route_to(a).ok().flatten(),
            _ => None,
        };
        if let Some(iface) = off_host {
            seen.push(format!(
                "{server}: not tried (a route via {iface}; no off-host traffic)"
            ));
            continue;
        }
        let addr = SocketAddr::new(server, 53);
        match udp_query(addr) {
            Ok(n) => return Verdict::escaped(format!("{addr} answered {n} bytes over UDP")),
            Err(e) => seen.push(format!("udp {addr}: {e}")),
        }
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(_) => return Verdict::escaped(format!("connected to {addr} over TCP")),
            Err(e) => seen.push(format!("tcp {addr}: {}", io_name(&e))),
        }
    }
    Verdict::blocked(join(&seen))
}

fn udp_query(addr: SocketAddr) -> Result<usize, String> {
    let bind = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let sock = UdpSocket::bind(bind).map_err(|e| format!("socket: {}", io_name(&e)))?;
    let _ = sock.set_read_timeout(Some(Duration::from_secs(1)));
    sock.send_to(QUERY, addr)
        .map_err(|e| format!("sendto: {}", io_name(&e)))?;
    let mut buf = [0u8; 512];
    sock.recv(&mut buf)
        .map_err(|e| format!("no answer: {}", io_name(&e)))
}
