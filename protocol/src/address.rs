//! Which IP addresses are public. Shared by every place where a user's URL
//! makes Kiln open a connection (completion callbacks, repository clones):
//! the API refuses a literal non-public address at submission, the worker
//! refuses a host that resolves to one. Pure: no lookups here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What kind of non-public address `ip` is, or `None` for a public one.
/// Covers loopback, private (RFC 1918, unique local), link-local (cloud
/// metadata services live at 169.254.169.254 and fd00:ec2::254), carrier-grade
/// NAT (Alibaba's metadata at 100.100.100.200), and everything reserved.
pub fn non_public_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            // ::ffff:127.0.0.1 reaches 127.0.0.1.
            Some(v4) => v4_kind(v4),
            None => v6_kind(v6),
        },
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared (carrier-grade NAT)")
    } else if ip.is_multicast()
        || ip.is_broadcast()
        || a >= 240
        || ip.is_documentation()
        // Benchmarking (198.18.0.0/15) and IETF protocol assignments (192.0.0.0/24).
        || (a == 198 && (18..20).contains(&b))
        || (a == 192 && b == 0 && ip.octets()[2] == 0)
    {
        Some("reserved")
    } else {
        None
    }
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_unique_local() {
        Some("private")
    } else if ip.is_unicast_link_local() || (first & 0xffc0) == 0xfec0 {
        // fec0::/10: the deprecated site-local range, still private in practice.
        Some("link-local")
    } else if ip.is_multicast() || first == 0x2001 && ip.segments()[1] == 0xdb8 {
        Some("reserved")
    } else if first == 0x64 && ip.segments()[1] == 0xff9b {
        // NAT64 (64:ff9b::/96) embeds an IPv4 address; judge that one.
        let [.., c, d] = ip.segments();
        let v4 = Ipv4Addr::new((c >> 8) as u8, c as u8, (d >> 8) as u8, d as u8);
        v4_kind(v4)
    } else if (first & 0xe000) != 0x2000 {
        // Outside 2000::/3, the only globally routed unicast space.
        Some("reserved")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(s: &str) -> Option<&'static str> {
        non_public_kind(s.parse().unwrap())
    }

    #[test]
    fn internal_addresses_are_not_public() {
        for (ip, expected) in [
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.100.100.200", "shared (carrier-grade NAT)"),
            ("0.0.0.0", "unspecified"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd00:ec2::254", "private"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
        ] {
            assert_eq!(kind(ip), Some(expected), "{ip}");
        }
        for ip in ["224.0.0.1", "255.255.255.255", "240.0.0.1", "192.0.2.1", "198.18.0.1", "ff02::1", "2001:db8::1"] {
            assert_eq!(kind(ip), Some("reserved"), "{ip}");
        }
    }

    #[test]
    fn public_addresses_are_public() {
        for ip in ["1.1.1.1", "8.8.8.8", "93.184.216.34", "100.128.0.1", "2606:4700:4700::1111", "64:ff9b::808:808"] {
            assert_eq!(kind(ip), None, "{ip}");
        }
    }
}
