//! Hosts as written and the allow-list that matches them.
//!
//! The proxy decides from the host a request names, before anything is
//! resolved: a name matches only name entries, an IP literal only the
//! same literal. So `127.0.0.1:P` is refused even when `localhost:P` is
//! allowed, and a name can never be smuggled in as a number (`127.1`,
//! `0x7f000001`): a name's last label must start with a letter, which no
//! numeric form does.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest host name (RFC 1035).
const MAX_NAME: usize = 253;
/// Longest label of a name.
const MAX_LABEL: usize = 63;

/// A host as a request or an entry writes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, lower-case, without a trailing dot.
    Name(String),
    /// An IP literal (IPv6 written in brackets).
    Ip(IpAddr),
}

impl Host {
    /// Parse `s`: a dotted-quad IPv4 address, a bracketed IPv6 address,
    /// or a DNS name (letters, digits, `-`, `_`; labels of 1–63; the last
    /// one starting with a letter). Anything else is refused with why.
    pub fn parse(s: &str) -> Result<Host, String> {
        if let Some(inner) = s.strip_prefix('[') {
            let v6 = inner
                .strip_suffix(']')
                .ok_or_else(|| format!("{s:?}: an IPv6 address needs its closing ']'"))?;
            return v6
                .parse::<Ipv6Addr>()
                .map(|a| Host::Ip(IpAddr::V6(a)))
                .map_err(|_| format!("{s:?} is not an IPv6 address"));
        }
        if let Ok(v4) = s.parse::<Ipv4Addr>() {
            return Ok(Host::Ip(IpAddr::V4(v4)));
        }
        name(s).map(Host::Name)
    }

    /// The name, when this is one.
    pub fn name(&self) -> Option<&str> {
        match self {
            Host::Name(n) => Some(n),
            Host::Ip(_) => None,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// A DNS name checked and lower-cased.
fn name(s: &str) -> Result<String, String> {
    let lower = s.to_ascii_lowercase();
    let n = lower.strip_suffix('.').unwrap_or(&lower);
    if n.is_empty() || n.len() > MAX_NAME {
        return Err(format!("{s:?}: a host name has 1 to {MAX_NAME} characters"));
    }
    if let Some(c) = n
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        let what = if crate::names::is_unsafe(c) {
            crate::names::describe(c)
        } else {
            format!("holds {c:?}")
        };
        return Err(format!(
            "{s:?}: a host name {what} (letters, digits, '-', '_' and '.' only)"
        ));
    }
    for label in n.split('.') {
        if label.is_empty() || label.len() > MAX_LABEL {
            return Err(format!(
                "{s:?}: every label of a name has 1 to {MAX_LABEL} characters"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("{s:?}: a label neither starts nor ends with '-'"));
        }
    }
    let last = n.rsplit('.').next().unwrap_or(n);
    if !last.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(format!(
            "{s:?} is neither an IPv4 address (four decimal numbers) nor a name (its last label starts with a letter)"
        ));
    }
    Ok(n.to_string())
}

/// Parse a port: 1–65535, decimal digits only.
pub fn port(s: &str) -> Result<u16, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 5 {
        return Err(format!("{s:?} is not a port (1-65535)"));
    }
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("{s:?} is not a port (1-65535)")),
    }
}

/// Split `host[:port]` (an IPv6 host in brackets; a bare IPv6 address is
/// taken whole, without a port).
pub(crate) fn split_host_port(s: &str) -> Result<(&str, Option<&str>), String> {
    if s.starts_with('[') {
        return match s.find(']') {
            Some(end) if end + 1 == s.len() => Ok((s, None)),
            Some(end) => match s[end + 1..].strip_prefix(':') {
                Some(p) => Ok((&s[..=end], Some(p))),
                None => Err(format!("{s:?}: only ':PORT' may follow an IPv6 address")),
            },
            None => Err(format!("{s:?}: an IPv6 address needs its closing ']'")),
        };
    }
    if s.matches(':').count() > 1 {
        return Ok((s, None));
    }
    Ok(match s.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    })
}

/// What an entry's host part matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// Exactly this host as written.
    Exact(Host),
    /// Any name below this one (`*.github.com`: `api.github.com`, not
    /// `github.com`).
    Below(String),
}

/// One allow-list entry: `HOST[:PORT]`, where `HOST` is a name, `*.NAME`
/// or an IP literal; without a port, 80 and 443.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pattern: Pattern,
    port: Option<u16>,
}

impl Entry {
    pub fn parse(s: &str) -> Result<Entry, String> {
        let s = s.trim();
        if s.contains("://") || s.contains(['/', '@', '?', '#']) {
            return Err(format!(
                "{s:?}: an entry is HOST[:PORT] (no scheme, user or path)"
            ));
        }
        let (host, port_text) = split_host_port(s)?;
        let port = port_text.map(port).transpose()?;
        let pattern = match host.strip_prefix("*.") {
            Some(rest) => Pattern::Below(name(rest)?),
            None if host.contains('*') => {
                return Err(format!(
                    "{s:?}: a wildcard is '*.' in front of a name (any subdomain of it)"
                ));
            }
            None if host.contains(':') && !host.starts_with('[') => {
                let v6: Ipv6Addr = host
                    .parse()
                    .map_err(|_| format!("{s:?} is not an IPv6 address"))?;
                Pattern::Exact(Host::Ip(IpAddr::V6(v6)))
            }
            None => Pattern::Exact(Host::parse(host)?),
        };
        Ok(Entry { pattern, port })
    }

    /// Whether this entry lets a request reach `host` (as written) on
    /// `port`.
    pub fn allows(&self, host: &Host, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => port == 80 || port == 443,
        };
        port_ok
            && match (&self.pattern, host) {
                (Pattern::Exact(want), got) => want == got,
                (Pattern::Below(suffix), Host::Name(n)) => n
                    .strip_suffix(suffix.as_str())
                    .and_then(|head| head.strip_suffix('.'))
                    .is_some_and(|head| !head.is_empty()),
                (Pattern::Below(_), Host::Ip(_)) => false,
            }
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pattern {
            Pattern::Exact(h) => write!(f, "{h}")?,
            Pattern::Below(n) => write!(f, "*.{n}")?,
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

/// An agent's allow-list: empty means no network at all (the default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

impl AllowList {
    /// Parse every entry; the first bad one is the error. Duplicates (as
    /// written after normalisation) are kept once.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, String> {
        let mut out: Vec<Entry> = Vec::new();
        for e in entries {
            let entry = Entry::parse(e.as_ref())?;
            if !out.contains(&entry) {
                out.push(entry);
            }
        }
        Ok(AllowList { entries: out })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in their canonical form (what `agent show` prints).
    pub fn to_strings(&self) -> Vec<String> {
        self.entries.iter().map(Entry::to_string).collect()
    }

    /// The first entry allowing `host:port`.
    /// Whether an entry names address `ip` literally (any port): the only
    /// way a name may lead to a private or local address, or the host's own.
    pub(crate) fn names_address(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.entries
            .iter()
            .any(|e| matches!(&e.pattern, Pattern::Exact(Host::Ip(a)) if a.to_canonical() == ip))
    }

    pub(crate) fn allowing(&self, host: &Host, port: u16) -> Option<&Entry> {
        self.entries.iter().find(|e| e.allows(host, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn hosts_parse_as_written() {
        assert_eq!(host("PyPI.org."), Host::Name("pypi.org".into()));
        assert_eq!(host("127.0.0.1"), Host::Ip("127.0.0.1".parse().unwrap()));
        assert_eq!(host("[::1]"), Host::Ip("::1".parse().unwrap()));
        assert_eq!(host("[::1]").to_string(), "[::1]");
        // Numeric forms a resolver would turn into addresses are no names.
        for bad in [
            "127.1",
            "0x7f000001",
            "2130706433",
            "0177.0.0.1",
            "1.2.3.4.5",
            "",
            ".",
            "a..b",
            "-a.com",
            "a-.com",
            "a b",
            "ex\u{202e}am",
            "é.com",
            "[::1",
            "[fe80::1%eth0]",
        ] {
            assert!(Host::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn entries_match_names_wildcards_and_literals() {
        let list = AllowList::parse(&[
            "pypi.org",
            "*.github.com",
            "localhost:8080",
            "10.0.0.5:5000",
            "[::1]:9000",
        ])
        .unwrap();
        let ok = |h: &str, p: u16| list.allowing(&host(h), p).is_some();
        assert!(ok("pypi.org", 443) && ok("pypi.org", 80) && !ok("pypi.org", 8443));
        assert!(
            !ok("files.pypi.org", 443),
            "a name entry is not its subdomains"
        );
        assert!(ok("api.github.com", 443) && ok("a.b.github.com", 80));
        assert!(!ok("github.com", 443), "a wildcard is not the apex");
        assert!(!ok("evilgithub.com", 443) && !ok("github.com.evil.org", 443));
        assert!(ok("localhost", 8080) && !ok("localhost", 8081));
        // The IP a name stands for is not the name.
        assert!(!ok("127.0.0.1", 8080));
        assert!(ok("10.0.0.5", 5000) && !ok("[::ffff:10.0.0.5]", 5000));
        assert!(ok("[::1]", 9000));
        assert_eq!(
            list.to_strings(),
            [
                "pypi.org",
                "*.github.com",
                "localhost:8080",
                "10.0.0.5:5000",
                "[::1]:9000"
            ]
        );
    }

    #[test]
    fn bad_entries_are_refused_with_a_reason() {
        for bad in [
            "*",
            "*.",
            "*.*.com",
            "a*.com",
            "http://pypi.org",
            "pypi.org/simple",
            "user@pypi.org",
            "pypi.org:0",
            "pypi.org:65536",
            "pypi.org:+1",
            "pypi.org:",
            "bad host",
            "127.1",
            "[::1]x",
            "\u{1b}[2Jpypi.org",
        ] {
            let e = Entry::parse(bad).unwrap_err();
            assert!(!e.contains('\u{1b}'), "{e}");
        }
        assert_eq!(Entry::parse("::1").unwrap().to_string(), "[::1]");
        assert_eq!(
            AllowList::parse(&["a.org", "A.org."]).unwrap().to_strings(),
            ["a.org"]
        );
    }
}
