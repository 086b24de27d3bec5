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
pub(crate) fn default_deny() -> Vec<Cidr> {
    DEFAULT_DENY
        .iter()
        .filter_map(|s| Cidr::parse(s).ok())
        .collect()
}

/// The host's own addresses: loopback and unspecified (`0.0.0.0`
/// connects to the host itself). Only the name `localhost` or a literal
/// entry reaches them; any other name resolving there is DNS pointing
/// the proxy at the host's own services.
pub(crate) fn is_host_local(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || ip.is_unspecified() || matches!(ip, IpAddr::V4(a) if a.octets()[0] == 0)
}

/// Ranges no name leads to unless an allow-list entry names the address
/// literally: this network and loopback, private (RFC 1918), shared
/// (CGNAT), link-local, the IETF protocol block, benchmarking, multicast,
/// reserved and broadcast; IPv6 unspecified, loopback, unique-local,
/// link-local, site-local and multicast. Names on a tenant's list may be
/// under its control (its own domain, a wildcard): its DNS must not
/// point the proxy into the host's networks.
pub const SPECIAL: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
];

/// The special range `ip` (IPv4-mapped forms judged as IPv4) lies in.
pub(crate) fn special_range(ip: IpAddr) -> Option<Cidr> {
    static RANGES: std::sync::OnceLock<Vec<Cidr>> = std::sync::OnceLock::new();
    RANGES
        .get_or_init(|| SPECIAL.iter().filter_map(|s| Cidr::parse(s).ok()).collect())
        .iter()
        .find(|c| c.contains(ip))
        .copied()
}

/// How long the host's interface addresses are trusted before they are
/// read again (an address added to an interface is seen within this).
const HOST_ADDRESSES_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// The addresses of this host's interfaces (`getifaddrs`), re-read at
/// most every [`HOST_ADDRESSES_TTL`].
pub fn host_addresses() -> Vec<IpAddr> {
    type Cache = std::sync::Mutex<Option<(std::time::Instant, Vec<IpAddr>)>>;
    static CACHE: Cache = std::sync::Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, v)) = cache.as_ref()
        && at.elapsed() < HOST_ADDRESSES_TTL
    {
        return v.clone();
    }
    let mut v: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map(|it| {
            it.filter_map(|i| {
                let a = i.address?;
                a.as_sockaddr_in()
                    .map(|s| IpAddr::V4(s.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.dedup();
    *cache = Some((std::time::Instant::now(), v.clone()));
    v
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
    fn special_ranges_hold_private_shared_and_local_addresses() {
        for s in [
            "10.1.2.3",
            "172.31.255.255",
            "192.168.0.1",
            "100.64.0.1",
            "100.127.255.254",
            "169.254.169.254",
            "127.0.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd12::1",
            "fe80::1",
            "ff02::1",
            "::ffff:10.0.0.1",
            "::ffff:192.168.1.1",
        ] {
            assert!(special_range(ip(s)).is_some(), "{s}");
        }
        for s in [
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1",
            "151.101.0.223",
        ] {
            assert!(special_range(ip(s)).is_none(), "{s}");
        }
    }

    #[test]
    fn the_hosts_own_addresses_are_read() {
        let own = host_addresses();
        assert!(own.contains(&ip("127.0.0.1")), "{own:?}");
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
