//! Accepting connections, for every door: limits on open connections (in all and per
//! client), deadlines that close connections which send nothing useful (kept on each
//! socket, see [`counted`]), and a close that resets nobody (the backlog is taken before
//! the listener goes).
//!
//! A full table does not shut newcomers out: the listener closes the connection least
//! likely to be a client's to make room, the oldest that has not sent its first request
//! yet, else the one idle longest, else the one whose request body comes slowest; and
//! the fuller the table, the less time a new connection has for its first request and a
//! request for its body (from half full, down to a tenth of `first_request` and of the
//! body deadline when full), while a body must keep coming at `min_receive_rate` (see
//! [`super::receive`]). So a client holding sockets open, idle, half-sent or sending a
//! body a byte at a time, from however many addresses, cannot keep others out.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::clients::Clients;
use super::counted::{Activity, Counted, Deadlines};
use super::Conn;
use crate::metrics;

/// How long a newcomer waits for the place of the connection closed to make room.
const EVICTED_WITHIN: Duration = Duration::from_millis(100);

/// What a listener allows its connections, and how it secures them.
#[derive(Clone)]
pub struct Connections {
    /// Open connections; past it new ones are closed at once.
    pub max: usize,
    /// Open connections from one client address (0: no limit of its own).
    pub per_client: usize,
    /// From accept to the first complete request head (HTTP/2: preface and first frame).
    pub first_request: Duration,
    /// How long a connection may have no request in flight before it is closed.
    pub idle: Duration,
    /// Bytes a second a client must take of an answer waiting to be written, over 10 s
    /// windows, or its connection is closed (0: no floor).
    pub min_send_rate: u64,
    /// How long a request body may take to arrive, from its request's head (less as the
    /// table fills).
    pub body: Duration,
    /// Bytes a second a request body in progress must arrive at, over 10 s windows, or
    /// it fails with 408 (0: no floor).
    pub min_receive_rate: u64,
    /// TLS, when the listener speaks it (see [`super::tls`]).
    pub tls: Option<TlsAcceptor>,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("max", &self.max)
            .field("per_client", &self.per_client)
            .field("first_request", &self.first_request)
            .field("idle", &self.idle)
            .field("min_send_rate", &self.min_send_rate)
            .field("body", &self.body)
            .field("min_receive_rate", &self.min_receive_rate)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Connections {
    /// The data doors' allowance, from the startup limits.
    pub fn from_limits(limits: &crate::config::Limits) -> Self {
        Connections {
            max: limits.max_connections,
            per_client: limits.max_connections_per_client,
            first_request: limits.header_read_timeout,
            idle: limits.idle_timeout,
            min_send_rate: limits.min_send_rate,
            body: limits.body_read_timeout,
            min_receive_rate: limits.min_receive_rate,
            tls: None,
        }
    }

    /// The same allowance, each connection secured by `tls` first.
    pub fn with_tls(mut self, tls: Option<TlsAcceptor>) -> Self {
        self.tls = tls;
        self
    }

    /// A small listener's (the admin API, the metrics endpoint): `max` connections,
    /// 10 s to the first request and to a request's body, 2 minutes idle.
    pub fn small(max: usize) -> Self {
        Connections {
            max,
            per_client: 0,
            first_request: Duration::from_secs(10),
            idle: Duration::from_secs(120),
            min_send_rate: 0,
            body: Duration::from_secs(10),
            min_receive_rate: 0,
            tls: None,
        }
    }
}

/// What a listener's request bodies are held to (see [`super::receive`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Bodies {
    deadline: Duration,
    min_rate: u64,
}

impl Bodies {
    /// `allow`'s.
    pub(super) fn of(allow: &Connections) -> Self {
        Bodies {
            deadline: allow.body,
            min_rate: allow.min_receive_rate,
        }
    }

    /// The rules of a body beginning now, with the table as full as `fill` says.
    pub(super) fn rules(&self, fill: &Fill) -> super::receive::Rules {
        super::receive::Rules {
            deadline: self.deadline.mul_f64(fill.share()),
            min_rate: self.min_rate,
        }
    }
}

/// Connections accepted on `listener` within `allow`'s limits (making room in a full
/// table, see the module's docs), until `closing` fires. Then those the kernel has
/// already completed (its backlog) are taken too, and only then is the listener closed:
/// closing it with them still queued would reset them, after their clients had sent a
/// request. New clients are refused at connect from then on.
/// With TLS, each connection's handshake runs on a task of its own (a slow one holds up
/// nobody) and the connection comes out once it is done.
pub(super) fn accept(
    listener: TcpListener,
    allow: Connections,
    closing: CancellationToken,
) -> (mpsc::Receiver<Conn>, Arc<Fill>) {
    let mut table = Table::new(&allow);
    let fill = table.fill.clone();
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        // Hands a counted connection on: at once, or once its TLS handshake is done.
        let hand_on = |counted: Counted, tx: &mpsc::Sender<Conn>| {
            let tx = tx.clone();
            let tls = allow.tls.clone();
            async move {
                match tls {
                    None => tx.send(Conn::Plain(counted)).await.is_ok(),
                    Some(tls) => {
                        tokio::spawn(async move {
                            let peer = counted.peer();
                            match tls.accept(counted).await {
                                Ok(secured) => {
                                    let _ = tx.send(Conn::Tls(Box::new(secured))).await;
                                }
                                Err(e) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                            }
                        });
                        true
                    }
                }
            }
        };
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = closing.cancelled() => break,
            };
            if let Some(counted) = table.enter(stream, peer, true).await {
                if !hand_on(counted, &tx).await {
                    return;
                }
            }
        }
        let Ok(listener) = listener.into_std() else { return };
        while let Ok((stream, peer)) = listener.accept() {
            let Ok(stream) = stream.set_nonblocking(true).and_then(|()| TcpStream::from_std(stream)) else {
                continue;
            };
            if let Some(counted) = table.enter(stream, peer, false).await {
                if !hand_on(counted, &tx).await {
                    return;
                }
            }
        }
        // `listener` closes here, with nothing left in its backlog.
    });
    (rx, fill)
}

/// How full a listener's table is, for the deadlines that shrink as it fills.
#[derive(Debug)]
pub(super) struct Fill {
    places: Arc<Semaphore>,
    max: usize,
}

impl Fill {
    /// The share of a deadline a connection gets now: all of it until the table is half
    /// full, then less as it fills, down to a tenth when full.
    pub(super) fn share(&self) -> f64 {
        let used = self.max - self.places.available_permits().min(self.max);
        let fill = used as f64 / self.max as f64;
        match fill <= 0.5 {
            true => 1.0,
            false => (2.0 * (1.0 - fill)).max(0.1),
        }
    }
}

/// A listener's open connections: their places, by client too, and each one's activity
/// (to choose which to close when a newcomer finds the table full).
struct Table {
    fill: Arc<Fill>,
    per_client: usize,
    clients: Arc<Clients>,
    open: Vec<Weak<Activity>>,
    deadlines: Deadlines,
}

impl Table {
    fn new(allow: &Connections) -> Self {
        let max = allow.max.clamp(1, Semaphore::MAX_PERMITS);
        Table {
            fill: Arc::new(Fill {
                places: Arc::new(Semaphore::new(max)),
                max,
            }),
            per_client: allow.per_client,
            clients: Arc::new(Clients::default()),
            open: Vec::new(),
            deadlines: Deadlines {
                first_request: allow.first_request,
                idle: allow.idle,
                min_send_rate: allow.min_send_rate,
            },
        }
    }

    /// `stream` counted in the table, or `None` (counted, and closed at once rather than
    /// let the backlog grow) when its client has its share, or the table is full and
    /// no place could be made (`make_room`: whether to try).
    async fn enter(&mut self, stream: TcpStream, peer: SocketAddr, make_room: bool) -> Option<Counted> {
        let refused = |reason| {
            ::metrics::counter!(metrics::ADMISSION_REFUSALS, "reason" => reason).increment(1);
            None
        };
        let place = match self.fill.places.clone().try_acquire_owned() {
            Ok(place) => place,
            Err(_) if make_room && self.make_room() => {
                let freed = tokio::time::timeout(EVICTED_WITHIN, self.fill.places.clone().acquire_owned()).await;
                match freed {
                    Ok(Ok(place)) => place,
                    _ => return refused("connections"),
                }
            }
            Err(_) => return refused("connections"),
        };
        let Some(client) = Clients::enter(&self.clients, peer.ip(), self.per_client) else {
            return refused("connections_per_client");
        };
        let _ = stream.set_nodelay(true);
        let deadlines = Deadlines {
            first_request: self.deadlines.first_request.mul_f64(self.fill.share()),
            ..self.deadlines
        };
        let counted = Counted::new(stream, peer, deadlines, (place, client));
        if self.open.len() >= 2 * self.fill.max {
            self.open.retain(|a| a.strong_count() > 0);
        }
        self.open.push(Arc::downgrade(counted.activity()));
        Some(counted)
    }

    /// Closes one connection to make room for a newcomer: the oldest that has not had
    /// its first request, else the one idle longest, else the one whose request body
    /// comes slowest; whether there was one. A connection without a request, or with
    /// a body on its way, is closed at once; an idle one is asked to close first.
    fn make_room(&mut self) -> bool {
        let open: Vec<Arc<Activity>> = self.open.iter().filter_map(Weak::upgrade).collect();
        let Some(victim) = choose(&open, Instant::now()) else {
            return false;
        };
        ::metrics::counter!(metrics::CONNECTIONS_CLOSED, "reason" => "evicted").increment(1);
        let opened = victim.opened.load(std::sync::atomic::Ordering::Acquire);
        match opened && victim.receive_rate(Instant::now()).is_none() {
            false => victim.close_now(),
            true => victim.close_soon(),
        }
        true
    }
}

/// The connection to close for a newcomer at `now` (see [`Table::make_room`]), if any
/// may be.
fn choose(open: &[Arc<Activity>], now: Instant) -> Option<&Arc<Activity>> {
    use std::sync::atomic::Ordering::Acquire;
    let live = open.iter().filter(|a| !a.is_closing());
    let silent = live
        .clone()
        .filter(|a| !a.opened.load(Acquire))
        .min_by_key(|a| a.accepted);
    let idle = || {
        live.clone()
            .filter(|a| a.in_flight.load(Acquire) == 0)
            .max_by_key(|a| (a.quiet.load(Acquire), std::cmp::Reverse(a.accepted)))
    };
    let slowest_body = || {
        live.clone()
            .filter_map(|a| Some((a.receive_rate(now)?, a)))
            .min_by(|x, y| x.0.total_cmp(&y.0))
            .map(|(_, a)| a)
    };
    silent.or_else(idle).or_else(slowest_body)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use tokio::time::Instant;

    use super::*;

    #[test]
    fn the_first_request_deadline_shrinks_as_the_table_fills() {
        let allow = Connections {
            first_request: Duration::from_secs(10),
            ..Connections::small(10)
        };
        let table = Table::new(&allow);
        let at = |taken: u32| {
            let held = table.fill.places.clone().try_acquire_many_owned(taken).expect("places");
            let deadline = allow.first_request.mul_f64(table.fill.share());
            drop(held);
            deadline
        };
        assert_eq!(at(0), Duration::from_secs(10));
        assert_eq!(at(5), Duration::from_secs(10), "up to half full, the whole deadline");
        assert_eq!(at(8), Duration::from_secs(4));
        assert_eq!(at(10), Duration::from_secs(1), "full: a tenth");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_closes_the_oldest_silent_connection_then_the_longest_idle_then_the_slowest_body() {
        let t0 = Instant::now();
        let at = |ms: u64| Arc::new(Activity::new(t0 + Duration::from_millis(ms)));
        let (busy, idle_long, idle_short, silent_old, silent_new) = (at(0), at(1), at(2), at(3), at(4));
        let (trickle, upload) = (at(5), at(6));
        for (opened, quiet) in [
            (&busy, 9),
            (&idle_long, 3),
            (&idle_short, 1),
            (&trickle, 0),
            (&upload, 0),
        ] {
            opened.opened.store(true, Ordering::Release);
            opened.quiet.store(quiet, Ordering::Relaxed);
        }
        for (receiving, bytes) in [(&trickle, 3), (&upload, 300_000)] {
            receiving.in_flight.store(1, Ordering::Release);
            receiving.receiving_began(t0);
            receiving.received(bytes);
        }
        busy.in_flight.store(1, Ordering::Release);
        let mut open = vec![
            busy.clone(),
            upload.clone(),
            idle_short.clone(),
            trickle.clone(),
            silent_new.clone(),
            idle_long.clone(),
            silent_old.clone(),
        ];
        tokio::time::advance(Duration::from_secs(3)).await;
        let chosen = |open: &[Arc<Activity>]| choose(open, Instant::now()).map(|a| a.accepted);
        assert_eq!(
            chosen(&open),
            Some(silent_old.accepted),
            "the oldest without a first request"
        );
        silent_old.close_now();
        assert_eq!(chosen(&open), Some(silent_new.accepted), "never one already closing");
        open.retain(|a| !Arc::ptr_eq(a, &silent_new));
        assert_eq!(chosen(&open), Some(idle_long.accepted), "then the one idle longest");
        open.retain(|a| !Arc::ptr_eq(a, &idle_long) && !Arc::ptr_eq(a, &idle_short));
        assert_eq!(
            chosen(&open),
            Some(trickle.accepted),
            "then the slowest body on its way"
        );
        open.retain(|a| !Arc::ptr_eq(a, &trickle));
        assert_eq!(
            chosen(&open),
            Some(upload.accepted),
            "however fast, a body is not yet an answer"
        );
        upload.receiving_ended();
        assert_eq!(chosen(&open), None, "never one whose request is being answered");
    }
}
