//! The real-time path's cost, guarded: a KServe v2 request through the HTTP door to a
//! real-time backend makes at most [`MOST`] heap allocations, counted on the thread
//! that polls it (`allocation-counter` counts per thread, so other tests and the
//! gateway's own tasks never add to it). Every allocation of the door, the pipeline,
//! the tier, the pool and the backend exchange is counted; what is made before the
//! door gets the request (the request itself) and after its answer is built (reading
//! the answer's body) is not.

use crate::common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use tiergate::front::http::HttpDoor;

/// The most allocations one real-time request may make. Measured with this test's own
/// figure (`cargo test --test it allocations -- --nocapture` prints it): raise it only
/// with a reason in the commit that does, and lower it when the path gets cheaper.
const MOST: u64 = 21;

/// `F`, with the allocations made while it is polled counted.
struct Counted<F> {
    inner: Pin<Box<F>>,
    allocations: u64,
}

impl<F: Future> Future for Counted<F> {
    type Output = (F::Output, u64);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut polled = None;
        let info = allocation_counter::measure(|| polled = Some(this.inner.as_mut().poll(cx)));
        this.allocations += info.count_total;
        match polled.expect("measure runs the closure") {
            Poll::Ready(out) => Poll::Ready((out, this.allocations)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// One KServe v2 request through `door`, and the allocations it made.
async fn counted_request(door: &Arc<HttpDoor>) -> (u16, u64) {
    let request = http::Request::post("/v2/models/m/infer")
        .header("content-type", "application/json")
        .header("x-tiergate-budget-ms", "250")
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .expect("a valid request");
    let answer = Counted {
        inner: Box::pin(door.clone().answer(request)),
        allocations: 0,
    };
    let (response, allocations) = answer.await;
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    (status, allocations)
}

#[tokio::test(flavor = "current_thread")]
async fn a_real_time_request_allocates_at_most_a_known_number_of_times() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let door = gw.door();
    // The first requests build the pool, open its connection and register series.
    for _ in 0..3 {
        assert_eq!(counted_request(door).await.0, 200);
    }
    let mut counts = Vec::new();
    for _ in 0..20 {
        let (status, allocations) = counted_request(door).await;
        assert_eq!(status, 200);
        counts.push(allocations);
    }
    counts.sort_unstable();
    let typical = counts[counts.len() / 2];
    println!("allocations per real-time request: median {typical}, all {counts:?}");
    assert!(
        typical <= MOST,
        "a real-time request now makes {typical} allocations (at most {MOST}): {counts:?}"
    );
    gw.stop().await.expect("stops");
}
