//! One connection to the proxy, from accept to record: read the request
//! head (bounded in size and time), decide from the host and port as
//! written and the agent's list, resolve an allowed name ourselves and
//! refuse one that leads where the operator forbids, connect, then relay
//! (a `CONNECT` tunnel, or the one request forwarded) under the idle and
//! byte limits. Every way out of here writes exactly one record.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::allow::{AllowList, Host};
use super::cidr::{self, Cidr};
use super::http::{self, HeadError, Partial, Refusal, Request, Target};
use super::log::{NetRecord, Verdict};
use super::relay::{Counts, relay};
use super::shared::{ChildRef, Egress, Policy, Slot};

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// After a refusal, how long and how much of what the client still sends
/// is read and dropped, so it reads the refusal instead of a reset.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: u64 = 4 * 1024 * 1024;

/// What a session knows for its record.
struct Attempt {
    started: Instant,
    time: String,
    method: String,
    host: String,
    port: Option<u16>,
}

impl Attempt {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            time: super::log::now(),
            method: String::new(),
            host: String::new(),
            port: None,
        }
    }

    fn learn(&mut self, p: &Partial) {
        self.method.clone_from(&p.method);
        if let Some(h) = &p.host {
            self.host = h.to_string();
        }
        self.port = p.port;
    }

    fn record(&self, child: &ChildRef, verdict: Verdict, end: End) -> NetRecord {
        NetRecord {
            time: self.time.clone(),
            agent: child.agent.clone(),
            role: child.role.clone(),
            child: child.id,
            method: self.method.clone(),
            host: self.host.clone(),
            port: self.port,
            address: end.address,
            verdict,
            reason: end.reason,
            bytes_up: end.up,
            bytes_down: end.down,
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// How a connection ended.
#[derive(Default)]
struct End {
    address: Option<String>,
    reason: Option<String>,
    up: u64,
    down: u64,
}

impl End {
    fn because(reason: impl Into<String>) -> Self {
        Self {
            reason: Some(reason.into()),
            ..Self::default()
        }
    }
}

/// Serve one accepted connection of `child` (its slot held until the end).
pub async fn session(
    egress: Arc<Egress>,
    child: Arc<ChildRef>,
    mut client: TcpStream,
    policy: Arc<Policy>,
    cancel: CancellationToken,
    slot: Slot,
) {
    let mut attempt = Attempt::new();
    let (verdict, end) = match decide(&egress, &child, &mut client, &policy, &mut attempt).await {
        Ok((req, rest, address)) => {
            // Counted as they move, so a connection cut at the command's end
            // is recorded with what it carried.
            let counts = Counts::default();
            let end = tokio::select! {
                end = forward(client, &req, rest, address, &policy, &counts) => end,
                () = cancel.cancelled() => End {
                    up: counts.up.load(Ordering::Relaxed),
                    down: counts.down.load(Ordering::Relaxed),
                    ..End::because("the command ended")
                },
            };
            (Verdict::Allowed, end)
        }
        Err(refusal) => {
            if refusal.verdict == Verdict::Denied {
                // In the audit log before the command hears the refusal.
                let denied = attempt.record(&child, Verdict::Denied, End::because(&refusal.reason));
                egress.audit_denied(&denied).await;
            }
            refuse(&mut client, &refusal).await;
            (refusal.verdict, End::because(refusal.reason))
        }
    };
    drop(slot);
    let record = attempt.record(&child, verdict, end);
    if record.verdict == Verdict::Allowed {
        egress.audit_transfer(&record).await;
    }
    egress.record(record).await;
}

/// A refusal, and how it is recorded (a request the policy allowed may
/// still fail: a server that cannot be reached is `allowed` with a
/// reason).
struct Refused {
    status: u16,
    reason: String,
    verdict: Verdict,
}

impl Refused {
    fn denied(r: Refusal) -> Self {
        Self {
            status: r.status,
            reason: r.reason,
            verdict: Verdict::Denied,
        }
    }

    fn failed(status: u16, reason: String) -> Self {
        Self {
            status,
            reason,
            verdict: Verdict::Allowed,
        }
    }
}

/// Read and judge the request; the request, bytes read past its head and
/// the connected server when it may go on.
async fn decide(
    egress: &Egress,
    child: &ChildRef,
    client: &mut TcpStream,
    policy: &Policy,
    attempt: &mut Attempt,
) -> Result<(Request, Vec<u8>, TcpStream), Refused> {
    let cfg = &policy.config;
    let read = tokio::time::timeout(cfg.request_timeout, http::read_head(client, http::MAX_HEAD));
    let (head, rest) = match read.await {
        Err(_) => {
            return Err(Refused::denied(Refusal::new(
                408,
                format!("no request within {}s", cfg.request_timeout.as_secs()),
            )));
        }
        Ok(Err(HeadError::TooLarge)) => {
            return Err(Refused::denied(Refusal::new(
                431,
                format!("request head larger than {} bytes", http::MAX_HEAD),
            )));
        }
        Ok(Err(HeadError::Closed)) => {
            return Err(Refused::denied(Refusal::new(
                400,
                "closed before a whole request",
            )));
        }
        Ok(Ok(h)) => h,
    };
    let req = match http::parse(&head) {
        Ok(r) => r,
        Err((refusal, partial)) => {
            attempt.learn(&partial);
            return Err(Refused::denied(refusal));
        }
    };
    attempt.learn(&Partial {
        method: req.method.clone(),
        host: Some(req.target.host().clone()),
        port: Some(req.target.port()),
    });
    let (host, port) = (req.target.host(), req.target.port());
    allowed(policy, child, host, port).map_err(|r| Refused::denied(Refusal::new(403, r)))?;
    let addrs = match host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(n) => egress
            .resolve(&child.agent, n, port)
            .await
            .map_err(|e| Refused::failed(502, format!("cannot resolve {n}: {e}")))?,
    };
    let list = policy.list.as_ref().ok();
    check_addresses(host, &addrs, &cfg.deny, list)
        .map_err(|r| Refused::denied(Refusal::new(403, r)))?;
    let server = connect(&addrs, port)
        .await
        .map_err(|e| Refused::failed(502, format!("cannot connect to {host}:{port}: {e}")))?;
    Ok((req, rest, server))
}

/// The policy's word on `host:port` as written.
fn allowed(policy: &Policy, child: &ChildRef, host: &Host, port: u16) -> Result<(), String> {
    if let Some(e) = &policy.config_error {
        return Err(format!("config.toml: {e}"));
    }
    let list = policy
        .list
        .as_ref()
        .map_err(|e| format!("the allow-list of agent {} is unreadable: {e}", child.agent))?;
    if list.is_empty() {
        return Err(format!(
            "agent {} has no network allow-list (mini-letta agent set-network)",
            child.agent
        ));
    }
    match list.allowing(host, port) {
        Some(_) => Ok(()),
        None => Err(format!(
            "{host}:{port} is not on the allow-list of agent {}",
            child.agent
        )),
    }
}

/// Refuse an allowed host whose addresses lead where they must not: into
/// `deny` (every address is checked: one bad answer among good ones is a
/// rebinding attempt), or, for a name, to the host itself (loopback and
/// unspecified but for `localhost`, and every address of its interfaces)
/// or into a private or local range ([`cidr::SPECIAL`]) — unless an entry
/// of `list` names that address literally. The caller connects to exactly
/// these addresses: the check is on what is connected to, once.
pub(crate) fn check_addresses(
    host: &Host,
    addrs: &[IpAddr],
    deny: &[Cidr],
    list: Option<&AllowList>,
) -> Result<(), String> {
    if addrs.is_empty() {
        return Err(format!("{host} has no address"));
    }
    for ip in addrs {
        if let Some(c) = deny.iter().find(|c| c.contains(*ip)) {
            return Err(match host {
                Host::Ip(_) => format!("{ip} is in deny_cidrs ({c})"),
                Host::Name(n) => format!("{n} resolves to {ip}, in deny_cidrs ({c})"),
            });
        }
        let Host::Name(n) = host else {
            // A literal address the list names: the operator's choice.
            continue;
        };
        let canonical = ip.to_canonical();
        if list.is_some_and(|l| l.names_address(canonical))
            || (n == "localhost" && canonical.is_loopback())
        {
            continue;
        }
        if cidr::is_host_local(canonical) {
            return Err(format!(
                "{n} resolves to {ip}, this host's own address (only `localhost` or a literal address reaches it)"
            ));
        }
        if cidr::host_addresses().contains(&canonical) {
            return Err(format!(
                "{n} resolves to {ip}, an address of this host's interfaces (only an entry naming the address reaches it)"
            ));
        }
        if let Some(c) = cidr::special_range(canonical) {
            return Err(format!(
                "{n} resolves to {ip}, in {c}, a private or local range (only an entry naming the address reaches it)"
            ));
        }
    }
    Ok(())
}

/// Connect to the first address that answers.
async fn connect(addrs: &[IpAddr], port: u16) -> Result<TcpStream, String> {
    let mut last = String::from("no address");
    for ip in addrs {
        let addr = SocketAddr::new(*ip, port);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
        }
    }
    Err(last)
}

/// Send the refusal, then read and drop what the client still sends for a
/// moment, so it gets the answer rather than a reset.
async fn refuse(client: &mut TcpStream, r: &Refused) {
    let body = Refusal::new(r.status, r.reason.clone()).response();
    let _ = tokio::time::timeout(LINGER, client.write_all(&body)).await;
    let _ = client.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 8192];
        let mut total = 0u64;
        while let Ok(n @ 1..) = client.read(&mut sink).await {
            total += n as u64;
            if total > LINGER_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Open the way to the server and relay until either side is done.
async fn forward(
    mut client: TcpStream,
    req: &Request,
    rest: Vec<u8>,
    mut server: TcpStream,
    policy: &Policy,
    counts: &Counts,
) -> End {
    let address = server.peer_addr().ok().map(|a| a.ip().to_string());
    // What goes to the server before the relay: the rewritten head of a
    // forwarded request, and whatever the client sent past its own head.
    let mut first = match &req.target {
        Target::Connect { .. } => Vec::new(),
        Target::Http { .. } => http::forward_head(req),
    };
    first.extend_from_slice(&rest);
    let tunnel = matches!(req.target, Target::Connect { .. });
    let opened = async {
        if tunnel {
            client.write_all(http::TUNNEL_OPEN).await?;
        }
        server.write_all(&first).await
    }
    .await;
    let mut end = match opened {
        Ok(()) => {
            counts.up.fetch_add(first.len() as u64, Ordering::Relaxed);
            let reason = relay(client, server, &policy.config, counts).await;
            End {
                address: None,
                reason,
                up: counts.up.load(Ordering::Relaxed),
                down: counts.down.load(Ordering::Relaxed),
            }
        }
        Err(e) => End::because(format!("cannot open the way: {e}")),
    };
    end.address = address;
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn addresses_a_name_leads_to_are_checked() {
        let deny = cidr::default_deny();
        let name = |n: &str| Host::Name(n.into());
        assert!(check_addresses(&name("pypi.org"), &ips(&["151.101.0.223"]), &deny, None).is_ok());
        // Metadata, even when a good address comes first.
        let e = check_addresses(
            &name("pypi.org"),
            &ips(&["1.2.3.4", "169.254.169.254"]),
            &deny,
            None,
        )
        .unwrap_err();
        assert!(e.contains("deny_cidrs"), "{e}");
        assert!(
            check_addresses(
                &name("x.org"),
                &ips(&["::ffff:169.254.169.254"]),
                &deny,
                None
            )
            .is_err()
        );
        // A name pointing the proxy at this host's own services.
        for local in ["127.0.0.1", "::1", "0.0.0.0", "127.1.2.3"] {
            let e =
                check_addresses(&name("evil.example"), &ips(&[local]), &deny, None).unwrap_err();
            assert!(e.contains("own address"), "{e}");
        }
        assert!(
            check_addresses(&name("localhost"), &ips(&["127.0.0.1", "::1"]), &deny, None).is_ok()
        );
        // A literal is judged by the ranges only: its entry was literal.
        let lit = Host::Ip("127.0.0.1".parse().unwrap());
        assert!(check_addresses(&lit, &ips(&["127.0.0.1"]), &deny, None).is_ok());
        let meta = Host::Ip("169.254.169.254".parse().unwrap());
        assert!(check_addresses(&meta, &ips(&["169.254.169.254"]), &deny, None).is_err());
        assert!(check_addresses(&name("x.org"), &[], &deny, None).is_err());
        // Private, shared and local ranges, and the host's interfaces: a
        // name leads there only where an entry names the address.
        for private in [
            "10.0.0.5",
            "192.168.1.1",
            "100.64.0.9",
            "fd00::5",
            "::ffff:172.16.0.1",
        ] {
            let e =
                check_addresses(&name("mine.example"), &ips(&[private]), &deny, None).unwrap_err();
            assert!(e.contains("private or local range"), "{e}");
        }
        for own in cidr::host_addresses() {
            let e = check_addresses(&name("mine.example"), &[own], &deny, None).unwrap_err();
            // Caught as the host's own, or by a range checked before it.
            assert!(
                ["this host", "deny_cidrs", "private or local"]
                    .iter()
                    .any(|w| e.contains(w)),
                "{own}: {e}"
            );
        }
        let literal = AllowList::parse(&["mine.example", "10.0.0.5:8080"]).unwrap();
        assert!(
            check_addresses(
                &name("mine.example"),
                &ips(&["10.0.0.5"]),
                &deny,
                Some(&literal)
            )
            .is_ok()
        );
        assert!(
            check_addresses(
                &name("mine.example"),
                &ips(&["10.0.0.6"]),
                &deny,
                Some(&literal)
            )
            .is_err()
        );
    }
}
