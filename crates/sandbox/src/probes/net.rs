//! Network attacks: loopback services of the host, egress, raw sockets
//! (§d rows 25–28). Egress probes only ever address TEST-NET-1
//! (192.0.2.1, RFC 5737) and only when no route covers it, so nothing can
//! leave the host.

use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use super::context::ProbeContext;
use super::util::{close, io_name, join, last_errno, route_to};
use super::verdict::Verdict;

/// The TEST-NET-1 address egress probes aim at.
const TEST_NET: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

/// Row 25: TCP `connect` to the host's listener on 127.0.0.1. Escaped if
/// the connection is made.
pub(crate) fn tcp_localhost(ctx: &ProbeContext) -> Verdict {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ctx.host_tcp_port));
    match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Ok(_) => Verdict::escaped(format!("connected to {addr}")),
        Err(e) => Verdict::blocked(format!("connect {addr}: {}", io_name(&e))),
    }
}

/// `Err(skip)` when a route could carry a packet to TEST-NET off the host.
fn no_route() -> Result<String, Verdict> {
    match route_to(TEST_NET) {
        Ok(None) => Ok(format!("no route covers {TEST_NET}")),
        Ok(Some(iface)) => Err(Verdict::skipped(format!(
            "a route to {TEST_NET} exists (via {iface}); the probe does not send off-host traffic"
        ))),
        Err(e) => Err(Verdict::skipped(format!(
            "{e}; the probe does not send traffic without knowing the routes"
        ))),
    }
}

/// Row 26: TCP `connect` to 192.0.2.1:9 with a 1 s timeout, only when no
/// route covers it (else skipped). Escaped if it connects.
pub(crate) fn tcp_egress(_ctx: &ProbeContext) -> Verdict {
    let routes = match no_route() {
        Ok(r) => r,
        Err(v) => return v,
    };
    let addr = SocketAddr::from((TEST_NET, 9));
    match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Ok(_) => Verdict::escaped(format!("connected to {addr}")),
        Err(e) => Verdict::blocked(format!("{routes}; connect {addr}: {}", io_name(&e))),
    }
}

/// Row 27: UDP `sendto` 192.0.2.1:53 (a DNS-shaped probe), only when no
/// route covers it (else skipped). Escaped if the datagram is sent.
pub(crate) fn udp_egress(_ctx: &ProbeContext) -> Verdict {
    let routes = match no_route() {
        Ok(r) => r,
        Err(v) => return v,
    };
    let sock = match UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) {
        Ok(s) => s,
        Err(e) => return Verdict::blocked(format!("UDP socket/bind: {}", io_name(&e))),
    };
    let addr = SocketAddr::from((TEST_NET, 53));
    match sock.send_to(b"\0\0\x01\0\0\x01\0\0\0\0\0\0", addr) {
        Ok(n) => Verdict::escaped(format!("sent {n} bytes to {addr}")),
        Err(e) => Verdict::blocked(format!("{routes}; sendto {addr}: {}", io_name(&e))),
    }
}

/// Row 28: create `AF_PACKET` raw, `AF_INET` raw (ICMP) and `AF_VSOCK`
/// sockets (nothing is sent). Escaped if any socket is created.
pub(crate) fn raw_sockets(_ctx: &ProbeContext) -> Verdict {
    let eth_p_all = i32::from(u16::to_be(libc::ETH_P_ALL as u16));
    let kinds = [
        (
            "AF_PACKET/SOCK_RAW",
            libc::AF_PACKET,
            libc::SOCK_RAW,
            eth_p_all,
        ),
        (
            "AF_INET/SOCK_RAW",
            libc::AF_INET,
            libc::SOCK_RAW,
            libc::IPPROTO_ICMP,
        ),
        ("AF_VSOCK/SOCK_STREAM", libc::AF_VSOCK, libc::SOCK_STREAM, 0),
    ];
    try_sockets(&kinds)
}

/// Row 72: stream sockets of a protocol other than TCP — MPTCP
/// (`IPPROTO_MPTCP`), which landlock's TCP rules do not cover, and SCTP —
/// of IPv4 and IPv6. Escaped if one is created (closed at once): even a
/// child that may open TCP sockets for the egress proxy gets only TCP.
pub(crate) fn stream_protocols(_ctx: &ProbeContext) -> Verdict {
    const IPPROTO_MPTCP: i32 = 262;
    let kinds = [
        ("AF_INET/MPTCP", libc::AF_INET, IPPROTO_MPTCP),
        ("AF_INET6/MPTCP", libc::AF_INET6, IPPROTO_MPTCP),
        ("AF_INET/SCTP", libc::AF_INET, libc::IPPROTO_SCTP),
    ];
    let kinds = kinds.map(|(name, domain, proto)| (name, domain, libc::SOCK_STREAM, proto));
    try_sockets(&kinds)
}

/// Try each (name, domain, type, protocol) socket: escaped if one is
/// created (closed at once), blocked with each refusal otherwise.
fn try_sockets(kinds: &[(&str, i32, i32, i32)]) -> Verdict {
    let mut got = Vec::new();
    let mut refused = Vec::new();
    for &(name, domain, ty, proto) in kinds {
        // SAFETY: socket() returns a new descriptor or -1.
        let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
        if fd >= 0 {
            got.push(format!("{name} created"));
            close(fd);
        } else {
            refused.push(format!("{name}: {}", last_errno()));
        }
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}
