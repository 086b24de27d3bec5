//! Address ranges the operator forbids (`[network] deny_cidrs`), and the
//! host's own addresses a name may never lead to.

use std::fmt;
use std::net::IpAddr;

/// Ranges refused by default: link-local (where cloud metadata services
/// answer, 169.254.169.254) and the metadata addresses outside it.
pub const DEFAULT_DENY: &[&str] = &[
    "169.254.0.0/16",
    "fe80::/10",
    // Alibaba Cloud's metadata service.
    "100.100.100.200/32",
    // AWS's IPv6 metadata service.
    "fd00:ec2::254/128",
];

/// An address range, `ADDRESS/PREFIX` (a bare address is one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let net: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?}: not an IP address range (ADDRESS/PREFIX)"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix is 0 to {max}"))?,
        };
        Ok(Cidr { net, prefix })
    }

    /// Whether `ip` lies in this range (an IPv4-mapped IPv6 address is
    /// judged as the IPv4 address it carries).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                prefix_match(&net.octets(), &a.octets(), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                prefix_match(&net.octets(), &a.octets(), self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_match(net: &[u8], addr: &[u8], prefix: u8) -> bool {
    let bits = usize::from(prefix);
    let (whole, rest) = (bits / 8, bits % 8);
    if net.get(..whole) != addr.get(..whole) {
        return false;
    }
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    match (net.get(whole), addr.get(whole)) {
        (Some(n), Some(a)) => n & mask == a & mask,
        _ => false,
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// The defaults, parsed.
pub fn default_deny() -> Vec<Cidr> {
    DEFAULT_DENY
        .iter()
        .filter_map(|s| Cidr::parse(s).ok())
        .collect()
}

/// The host's own addresses: loopback and unspecified (`0.0.0.0`
/// connects to the host itself). Only the name `localhost` or a literal
/// entry reaches them; any other name resolving there is DNS pointing
/// the proxy at the host's own services.
pub fn is_host_local(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || ip.is_unspecified() || matches!(ip, IpAddr::V4(a) if a.octets()[0] == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_contain_what_they_should() {
        let deny = default_deny();
        assert_eq!(deny.len(), DEFAULT_DENY.len());
        let denied = |s: &str| deny.iter().any(|c| c.contains(ip(s)));
        assert!(denied("169.254.169.254") && denied("169.254.0.1"));
        assert!(
            denied("::ffff:169.254.169.254"),
            "IPv4-mapped IPv6 is the IPv4 address"
        );
        assert!(denied("fe80::1") && denied("febf::1") && !denied("fec0::1"));
        assert!(denied("100.100.100.200") && !denied("100.100.100.201"));
        assert!(!denied("169.255.0.1") && !denied("8.8.8.8") && !denied("127.0.0.1"));
        assert_eq!(Cidr::parse("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert!(Cidr::parse("10.1.2.3").unwrap().contains(ip("10.1.2.3")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("1.2.3.4")));
        for bad in ["10.0.0.0/33", "fe80::/129", "nope/8", "10.0.0.0/x", ""] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_local_addresses() {
        for s in [
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "0.0.0.0",
            "0.1.2.3",
            "::",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_host_local(ip(s)), "{s}");
        }
        for s in ["10.0.0.1", "8.8.8.8", "::2"] {
            assert!(!is_host_local(ip(s)), "{s}");
        }
    }
}
