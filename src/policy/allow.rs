//! The backend allowlist: where a policy's pools may point.
//!
//! Beside validation. A policy can be edited over the admin API, so a backend URL is
//! dangerous input: pointed at a metadata service or an internal admin port, the
//! gateway would become a proxy into the network (SSRF). The allowlist comes from the
//! startup settings (`backends.allow`), which the admin API cannot change, and every
//! policy (at start, on reload and on every admin edit) must keep each endpoint inside
//! it. Host names are matched as written and never resolved, so the answer cannot
//! change with DNS.

use std::net::IpAddr;

use http::Uri;
use ipnet::IpNet;

use super::{Policy, Problem, Problems};

/// Networks and host names backend endpoints may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    any: bool,
    nets: Vec<IpNet>,
    hosts: Vec<String>,
    suffixes: Vec<String>,
}

impl Allowlist {
    /// Parses entries: `*`, a network (`10.0.0.0/8`), an address, a host name, or a
    /// host suffix (`*.svc.cluster.local`). Names are compared case-insensitively.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Allowlist, String> {
        let mut list = Allowlist::default();
        for entry in entries {
            let entry = entry.as_ref().trim();
            if entry == "*" {
                list.any = true;
            } else if let Ok(net) = entry.parse::<IpNet>() {
                list.nets.push(net);
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                list.nets.push(IpNet::from(ip));
            } else if let Some(suffix) = entry.strip_prefix("*.") {
                host_name(suffix).map_err(|e| format!("backends.allow entry {entry:?}: {e}"))?;
                list.suffixes.push(format!(".{}", suffix.to_ascii_lowercase()));
            } else {
                host_name(entry).map_err(|e| format!("backends.allow entry {entry:?}: {e}"))?;
                list.hosts.push(entry.to_ascii_lowercase());
            }
        }
        Ok(list)
    }

    /// Whether `endpoint`'s host is inside the list.
    pub fn permits(&self, endpoint: &Uri) -> bool {
        if self.any {
            return true;
        }
        let Some(host) = endpoint.host() else {
            return false;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<IpAddr>() {
            return self.nets.iter().any(|net| net.contains(&ip));
        }
        let host = host.to_ascii_lowercase();
        self.hosts.contains(&host) || self.suffixes.iter().any(|s| host.ends_with(s.as_str()))
    }

    /// Every endpoint of `policy` outside the list, as problems with their paths.
    pub fn check(&self, policy: &Policy) -> Result<(), Problems> {
        let mut problems = Vec::new();
        for route in policy.routes() {
            let pools = [
                ("realtime", route.realtime.as_deref()),
                ("micro_batch", route.micro_batch.as_ref().map(|b| &*b.pool)),
                ("shadow.candidate", route.shadow.as_ref().map(|s| &*s.candidate)),
                ("fallback", route.fallback.as_deref()),
            ];
            for (tier, pool) in pools {
                for (i, endpoint) in pool.iter().flat_map(|p| p.endpoints.iter().enumerate()) {
                    if !self.permits(endpoint) {
                        problems.push(Problem {
                            file: route.file.clone(),
                            path: format!("routes.{}.{tier}.endpoints[{i}]", route.name),
                            message: format!(
                                "{endpoint} is outside the backend allowlist (backends.allow in the startup \
                                 settings); add its host or network there and restart to allow it"
                            ),
                        });
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Problems(problems))
        }
    }
}

/// Checks that `name` is a plausible DNS host name.
fn host_name(name: &str) -> Result<(), &'static str> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err("not a network, address or host name")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().expect("uri")
    }

    #[test]
    fn networks_addresses_names_and_suffixes() {
        let list = Allowlist::parse(&["10.0.0.0/8", "::1", "Triton.internal", "*.svc.cluster.local"]).expect("parses");
        assert!(list.permits(&uri("http://10.2.3.4:8000")));
        assert!(!list.permits(&uri("http://11.0.0.1:8000")));
        assert!(list.permits(&uri("grpc://[::1]:8001")));
        assert!(list.permits(&uri("http://triton.INTERNAL:8000")));
        assert!(!list.permits(&uri("http://triton.internal.evil.com:8000")));
        assert!(list.permits(&uri("http://a.b.svc.cluster.local")));
        assert!(!list.permits(&uri("http://svc.cluster.local.evil")));
        assert!(!list.permits(&uri("http://169.254.169.254/latest")), "metadata service");
    }

    #[test]
    fn star_allows_everything_and_junk_is_refused() {
        assert!(Allowlist::parse(&["*"])
            .expect("star")
            .permits(&uri("http://anything:1")));
        let err = Allowlist::parse(&["10.0.0.0/33"]).expect_err("bad prefix");
        assert!(err.contains("10.0.0.0/33"), "{err}");
        assert!(Allowlist::parse(&["http://x"]).is_err());
        assert!(
            !Allowlist::default().permits(&uri("http://127.0.0.1:1")),
            "empty allows nothing"
        );
    }
}
