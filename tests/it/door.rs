//! The HTTP door driven without a socket (`HttpDoor::answer` takes any request body, so a
//! test builds a `Request<Full<Bytes>>` as axum tests call a router with `oneshot`),
//! and the size of the future hyper keeps for every open connection.

use crate::common;

use std::future::Future;
use std::sync::Arc;

use common::*;
use hyper::body::Incoming;
use tiergate::front::http::HttpDoor;

async fn door_call(door: &Arc<HttpDoor>, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let door = door.clone();
    // The door's own fields ride in the answer's body for the server to write; a caller
    // without a server puts them in the header map.
    let answer = |r| {
        let door = door.clone();
        async move {
            let (mut head, mut body) = door.answer(r).await.into_parts();
            body.stamp_headers(&mut head.headers);
            http::Response::from_parts(head, body)
        }
    };
    oneshot(answer, method, path, headers, body.to_owned()).await
}

#[tokio::test]
async fn health_metadata_and_an_infer_without_a_socket() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let door = gw.door();
    assert_eq!(door_call(door, "GET", "/v2/health/live", &[], "").await.status, 200);
    assert_eq!(door_call(door, "GET", "/v2/health/ready", &[], "").await.status, 200);
    let json = [("content-type", "application/json")];
    let answer = door_call(door, "POST", "/v2/models/m/infer", &json, BODY).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.tier(), (Some("realtime"), Some("budget_realtime")));
    let bad = door_call(
        door,
        "POST",
        "/v2/models/m/infer",
        &json,
        r#"{"inputs": [{"name": "INPUT0"}]}"#,
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("datatype"), "the mistake is named: {}", bad.text());
    let unknown = door_call(door, "POST", "/v2/models/nope/infer", &json, BODY).await;
    assert_eq!(unknown.status, 404);
    gw.stop().await.expect("stops");
}

/// The future hyper keeps for every open connection, idle keep-alive ones too, is the
/// door's: each path's work is boxed inside it so it stays small (6.9 KiB before the
/// boxing; 1,224 bytes in the test build when this test was written, less in release).
/// Measured as a type's size: nothing runs.
#[test]
fn the_doors_future_stays_small() {
    fn size<F: Future>(_: fn(Arc<HttpDoor>, http::Request<Incoming>) -> F) -> usize {
        std::mem::size_of::<F>()
    }
    let bytes = size(|door, request| door.answer(request));
    assert!(
        bytes <= 1536,
        "HttpDoor::answer's future is {bytes} bytes: box the path that grew it"
    );
}
