//! The gateway's listeners, bound before anything else starts (tests pass port 0).

use std::net::SocketAddr;

use tokio::net::TcpListener;

use super::StartError;
use crate::config::Config;

/// The bound listeners a gateway serves on.
#[derive(Debug)]
pub(super) struct Listeners {
    pub(super) http: TcpListener,
    pub(super) grpc: TcpListener,
    pub(super) metrics: TcpListener,
    /// When the admin API is on.
    pub(super) admin: Option<TcpListener>,
    /// When the bulk doors are on.
    pub(super) bulk_http: Option<TcpListener>,
    pub(super) bulk_grpc: Option<TcpListener>,
}

impl Listeners {
    /// Binds every listener `config` names (the admin API's when `admin` is on).
    pub(super) async fn bind(config: &Config, admin: bool) -> Result<Listeners, StartError> {
        let (l, backlog) = (&config.listen, config.limits.listen_backlog);
        Ok(Listeners {
            http: bind("HTTP door", l.http, backlog).await?,
            grpc: bind("gRPC door", l.grpc, backlog).await?,
            metrics: bind("metrics endpoint", l.metrics, backlog).await?,
            admin: bind_some("admin API", admin.then_some(l.admin), backlog).await?,
            bulk_http: bind_some("bulk HTTP door", l.bulk_http, backlog).await?,
            bulk_grpc: bind_some("bulk gRPC door", l.bulk_grpc, backlog).await?,
        })
    }
}

/// Binds `addr` with a queue of `backlog` connections the kernel has accepted and the
/// gateway not yet taken (tokio's own `bind` keeps 1,024: a spike of new connections
/// overflows it, and an overflowed client waits a second or more to retry).
async fn bind(what: &'static str, addr: SocketAddr, backlog: u32) -> Result<TcpListener, StartError> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    };
    socket
        .and_then(|s| {
            s.set_reuseaddr(true)?;
            s.bind(addr)?;
            s.listen(backlog)
        })
        .map_err(|source| StartError::Bind { what, addr, source })
}

/// Binds `addr` when it is set, as [`bind`] does.
async fn bind_some(
    what: &'static str,
    addr: Option<SocketAddr>,
    backlog: u32,
) -> Result<Option<TcpListener>, StartError> {
    match addr {
        Some(addr) => bind(what, addr, backlog).await.map(Some),
        None => Ok(None),
    }
}

/// The address `listener` is bound to.
pub(super) fn local(listener: &TcpListener) -> SocketAddr {
    listener.local_addr().expect("a bound TCP listener has a local address")
}
