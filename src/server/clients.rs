//! Open connections by client, for the per-client limit. An IPv4 client is its address;
//! an IPv6 client is its /64, the least a site is given, so one host cannot take a
//! listener's connections by spreading them over the 2^64 addresses of its own network.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

/// Open connections by client.
#[derive(Debug, Default)]
pub(super) struct Clients(Mutex<HashMap<IpAddr, usize>>);

/// One open connection of a client, given back on drop.
#[derive(Debug)]
pub(super) struct Client {
    clients: Arc<Clients>,
    key: IpAddr,
}

impl Clients {
    /// A place for one more connection from `ip`, or `None` when its client has `max`
    /// (0: no limit, and no count kept).
    pub(super) fn enter(this: &Arc<Self>, ip: IpAddr, max: usize) -> Option<Option<Client>> {
        if max == 0 {
            return Some(None);
        }
        let key = client_of(ip);
        let mut open = this.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(key).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Some(Client {
            clients: this.clone(),
            key,
        }))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut open = self.clients.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// The client `ip` counts as: itself (IPv4, or an IPv4 address mapped into IPv6), else
/// its /64.
fn client_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_network_counts_as_one_client_and_ipv4_addresses_apart() {
        let clients = Arc::new(Clients::default());
        let a: IpAddr = "2001:db8:1:2::1".parse().expect("v6");
        let b: IpAddr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().expect("v6");
        let other: IpAddr = "2001:db8:1:3::1".parse().expect("v6");
        let held = [Clients::enter(&clients, a, 2), Clients::enter(&clients, b, 2)];
        assert!(held.iter().all(|h| matches!(h, Some(Some(_)))));
        assert!(Clients::enter(&clients, b, 2).is_none(), "the /64 has its two");
        assert!(
            Clients::enter(&clients, other, 2).is_some(),
            "another /64 is another client"
        );
        drop(held);
        assert!(Clients::enter(&clients, a, 2).is_some(), "given back on drop");
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().expect("mapped");
        assert_eq!(client_of(mapped), "192.0.2.7".parse::<IpAddr>().expect("v4"));
        let v4: IpAddr = "192.0.2.8".parse().expect("v4");
        assert_eq!(client_of(v4), v4);
    }
}
