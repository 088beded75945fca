//! The KServe v2 HTTP door: health, metadata, byte-exact infer pass-through, and
//! answers to bad requests.

use crate::common;

use bytes::Bytes;
use common::*;

fn binary_body() -> (Bytes, String) {
    let header = r#"{"id":"bin-1","inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}},{"name":"OUTPUT1"}]}"#;
    let mut body = header.as_bytes().to_vec();
    for v in [1.5f32, -2.0, 3.25] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    (Bytes::from(body), header.len().to_string())
}

#[tokio::test]
async fn health_and_metadata() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let addr = gw.http_addr();
    assert_eq!(get(addr, "/v2/health/live").await.status, 200);
    assert_eq!(get(addr, "/v2/health/ready").await.status, 200);
    let server = get(addr, "/v2").await;
    assert_eq!(server.json()["name"], "tiergate");
    // Model metadata and readiness come from the route's backend, unchanged.
    for path in [
        "/v2/models/m",
        "/v2/models/m/versions/1",
        "/v2/models/m/ready",
        "/v2/models/m/versions/1/ready",
    ] {
        let via = get(addr, path).await;
        let direct = get(rt.addr, path).await;
        assert_eq!((via.status, &via.body), (direct.status, &direct.body), "{path}");
        assert_eq!(via.status, 200, "{path}");
    }
    assert_eq!(get(addr, "/v2/models/m").await.json()["name"], "m");
    let unknown = get(addr, "/v2/models/nope").await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.json()["error"]
        .as_str()
        .expect("error shape")
        .contains("unknown model 'nope'"));
    let wrong = send("DELETE", addr, "/v2/health/live", &[], Bytes::new()).await;
    assert_eq!(wrong.status, 405);
    assert_eq!(get(addr, "/nowhere").await.status, 404);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn json_infer_passes_through_byte_exact() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let via = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
    assert_eq!(via.status, 200, "{}", via.text());
    let received = rt.sim.stats("m").expect("stats").last_request;
    assert_eq!(
        received,
        Bytes::from_static(BODY.as_bytes()),
        "the backend got our exact bytes"
    );
    let direct = infer(rt.addr, "m", &[], BODY).await;
    assert_eq!(via.body, direct.body, "the client got the backend's exact bytes");
    assert_eq!(via.header("content-type"), direct.header("content-type"));
    assert_eq!(via.tier(), (Some("realtime"), Some("budget_realtime")));
    // and the answer is the simulator's: each row echoed, row sums computed
    let out = via.json();
    assert_eq!(out["id"], "req-1");
    assert_eq!(out["outputs"][1]["data"], serde_json::json!([10.0, 26.0]));
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn binary_extension_passes_through_byte_exact() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let (body, header_len) = binary_body();
    let headers = [
        ("inference-header-content-length", header_len.as_str()),
        ("content-type", "application/octet-stream"),
    ];
    let via = send("POST", gw.http_addr(), "/v2/models/m/infer", &headers, body.clone()).await;
    assert_eq!(via.status, 200, "{}", via.text());
    assert_eq!(
        rt.sim.stats("m").expect("stats").last_request,
        body,
        "the backend got our exact bytes"
    );
    let direct = send("POST", rt.addr, "/v2/models/m/infer", &headers, body.clone()).await;
    assert_eq!(via.body, direct.body, "the client got the backend's exact bytes");
    let json_len: usize = via
        .header("inference-header-content-length")
        .expect("binary answer")
        .parse()
        .expect("number");
    assert_eq!(via.body.len() - json_len, 12, "OUTPUT0 came back as 12 raw bytes");
    assert_eq!(
        &via.body[json_len..],
        &body[body.len() - 12..],
        "OUTPUT0 is the input row, bit for bit"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn bad_requests_get_4xx_that_say_what_to_fix() {
    let rt = backend(&["m"]).await;
    let mut config = config();
    config.limits.max_body_bytes = 1024;
    let gw = gateway_with(config, &route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let addr = gw.http_addr();
    // (body, headers, status, what the message names)
    type Case = (&'static str, &'static [(&'static str, &'static str)], u16, &'static str);
    let cases: &[Case] = &[
        ("{not json", &[], 400, "not JSON"),
        (
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2,4],"data":[1,2,3]}]}"#,
            &[],
            400,
            "inputs[0]",
        ),
        (
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP33","shape":[1],"data":[1]}]}"#,
            &[],
            400,
            "FP33",
        ),
        (r#"{"inputs":[]}"#, &[], 400, "inputs"),
        (
            BODY,
            &[("x-tiergate-budget-ms", "soon")],
            400,
            "x-tiergate-budget-ms must be a whole number",
        ),
        (
            BODY,
            &[("inference-header-content-length", "9999")],
            400,
            "inference-header-content-length",
        ),
    ];
    for (body, headers, status, needle) in cases {
        let a = infer(addr, "m", headers, body).await;
        assert_eq!(a.status, *status, "{body}: {}", a.text());
        let message = a.json()["error"].as_str().expect("error shape").to_owned();
        assert!(message.contains(needle), "{body}: {message}");
    }
    let big = format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1]}}],"pad":"{}"}}"#,
        "x".repeat(2000)
    );
    let a = infer(addr, "m", &[], &big).await;
    assert_eq!(a.status, 413);
    assert!(a.json()["error"].as_str().expect("error").contains("1024-byte limit"));
    let unknown = infer(addr, "nope", &[], BODY).await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.json()["error"]
        .as_str()
        .expect("error")
        .contains("unknown model 'nope'"));
    assert_eq!(
        rt.sim.stats("m").expect("stats").requests,
        0,
        "no bad request reached the backend"
    );
    // and the gateway still serves everyone else
    assert_eq!(infer(addr, "m", &[], BODY).await.status, 200);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn json_routes_match_by_path() {
    let rt = backend(&["m"]).await;
    let policy = format!(
        "[routes.embed]\npaths = [\"/v1/models/m:predict\"]\n[routes.embed.realtime]\nendpoints = [\"{}\"]\n",
        rt.url()
    );
    let gw = gateway(&policy).await;
    let headers = [("content-type", "application/json"), ("x-tiergate-budget-ms", "100")];
    // The simulator's TF-Serving service answers; the gateway classified the request
    // and forwarded it byte for byte.
    let a = send(
        "POST",
        gw.http_addr(),
        "/v1/models/m:predict",
        &headers,
        r#"{"instances":[[1,2]]}"#,
    )
    .await;
    assert_eq!(a.tier(), (Some("realtime"), Some("budget_realtime")));
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        a.json(),
        serde_json::json!({"predictions": [3.0]}),
        "the backend's own answer passes through"
    );
    let bad = send("POST", gw.http_addr(), "/v1/models/m:predict", &headers, "{oops").await;
    assert_eq!(bad.status, 400);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_refused_not_ignored() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let be = backend(&["m"]).await;
    let gw = gateway(&route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    for coding in ["gzip, chunked", "chunked, chunked, deflate"] {
        let mut stream = tokio::net::TcpStream::connect(gw.http_addr()).await.expect("connect");
        let request = format!(
            "POST /v2/models/m/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             transfer-encoding: {coding}\r\nconnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.expect("read");
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.1 501") || text.starts_with("HTTP/1.1 400"),
            "{coding}: refused, got {text}"
        );
        assert!(!text.contains("x-tiergate-tier"), "{coding}: never served: {text}");
    }
    // The gzip case reaches the door and is named in its answer.
    let mut stream = tokio::net::TcpStream::connect(gw.http_addr()).await.expect("connect");
    stream
        .write_all(
            b"POST /v2/models/m/infer HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\
              connection: close\r\n\r\n0\r\n\r\n",
        )
        .await
        .expect("write");
    let mut got = Vec::new();
    stream.read_to_end(&mut got).await.expect("read");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 501"), "{text}");
    assert!(
        text.contains("Transfer-Encoding \\\"gzip\\\" is not supported"),
        "{text}"
    );
    assert_eq!(be.sim.stats("m").expect("stats").requests, 0);
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).expect("write");
    encoder.finish().expect("finish")
}

#[tokio::test]
async fn compressed_requests_are_read_and_answers_compressed_when_asked() {
    use std::io::Read;
    let rt = backend(&["m"]).await;
    let mut config = config();
    config.limits.max_body_bytes = 64 << 10;
    let gw = gateway_with(config, &route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let path = "/v2/models/m/infer";
    let json = ("content-type", "application/json");

    // One rule for x-tiergate-priority on every tier: a real-time call names a band too.
    let headers = [json, ("x-tiergate-priority", "urgent")];
    let bad = send("POST", gw.http_addr(), path, &headers, BODY.as_bytes().to_vec()).await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert!(bad.text().contains("x-tiergate-priority must be"), "{}", bad.text());

    // gzip in, gzip out, as tritonclient's request and response compression ask.
    let body = gzip(BODY.as_bytes());
    let headers = [json, ("content-encoding", "gzip"), ("accept-encoding", "gzip")];
    let answer = send("POST", gw.http_addr(), path, &headers, body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("content-encoding"), Some("gzip"));
    assert_eq!(
        answer.header("vary"),
        Some("accept-encoding"),
        "caches keep each coding apart"
    );
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&answer.body[..])
        .read_to_string(&mut plain)
        .expect("gunzip");
    let plain: serde_json::Value = serde_json::from_str(&plain).expect("json");
    assert_eq!(
        plain["outputs"][0]["data"],
        serde_json::json!([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    );
    let seen = rt.sim.stats("m").expect("stats").requests;
    assert_eq!(seen, 1, "the backend got the decoded request");

    // Without Accept-Encoding the answer is plain.
    let answer = send(
        "POST",
        gw.http_addr(),
        path,
        &[json, ("content-encoding", "gzip")],
        gzip(BODY.as_bytes()),
    )
    .await;
    assert_eq!((answer.status, answer.header("content-encoding")), (200, None));
    assert!(answer.json()["outputs"].is_array());

    // 300 KiB that compress to a few hundred bytes: the decoded size meets the limit.
    let inflating = format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,3],"data":[1,2,3]}}],"pad":"{}"}}"#,
        " ".repeat(300 << 10)
    );
    let small = gzip(inflating.as_bytes());
    assert!(small.len() < 4096, "{} bytes compressed", small.len());
    let answer = send(
        "POST",
        gw.http_addr(),
        path,
        &[json, ("content-encoding", "gzip")],
        small,
    )
    .await;
    assert_eq!(answer.status, 413, "{}", answer.text());
    assert!(
        answer.text().contains("decodes (gzip) to more than"),
        "{}",
        answer.text()
    );

    // A coding the door does not read is named, not mistaken for JSON.
    let answer = send("POST", gw.http_addr(), path, &[json, ("content-encoding", "br")], BODY).await;
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert!(
        answer.text().contains("Content-Encoding \\\"br\\\" is not supported"),
        "{}",
        answer.text()
    );
    assert_eq!(
        rt.sim.stats("m").expect("stats").requests,
        2,
        "nothing refused reached the backend"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn statistics_of_every_model_and_shared_memory_refused() {
    let be = backend(&["a", "b"]).await;
    let policy: String = ["a", "b"]
        .iter()
        .map(|m| {
            format!(
                "[routes.{m}]\nmodels = [\"{m}\"]\n[routes.{m}.flags]\nrealtime = true\n\
                 [routes.{m}.realtime]\nendpoints = [\"{}\"]\n",
                be.url()
            )
        })
        .collect();
    let gw = gateway(&policy).await;
    assert_eq!(infer(gw.http_addr(), "b", &[], BODY).await.status, 200);
    let stats = get(gw.http_addr(), "/v2/models/stats").await;
    assert_eq!(stats.status, 200, "{}", stats.text());
    let stats = stats.json();
    let names: Vec<&str> = stats["model_stats"]
        .as_array()
        .expect("model_stats")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(names, ["a", "b"], "every model, not an unknown model 'stats'");
    assert_eq!(stats["model_stats"][1]["inference_count"], 1);

    // Shared memory: nothing is ever registered, and registering says why.
    let status = get(gw.http_addr(), "/v2/systemsharedmemory/status").await;
    assert_eq!((status.status, status.text().as_str()), (200, "[]"));
    let register = send(
        "POST",
        gw.http_addr(),
        "/v2/systemsharedmemory/region/r0/register",
        &[("content-type", "application/json")],
        r#"{"key":"/r0","offset":0,"byte_size":64}"#,
    )
    .await;
    assert_eq!(register.status, 400, "{}", register.text());
    assert!(
        register.text().contains("cannot use shared memory"),
        "{}",
        register.text()
    );
    let unregister = send("POST", gw.http_addr(), "/v2/cudasharedmemory/unregister", &[], "").await;
    assert_eq!(unregister.status, 200);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn json_nested_past_the_depth_limit_never_reaches_a_backend() {
    let rt = backend(&["m"]).await;
    let toml = format!(
        "[routes.j]\npaths = [\"/v1/models/m:predict\"]\n[routes.j.realtime]\nendpoints = [\"{}\"]\n\
         [routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"{}\"]\n",
        rt.url(),
        rt.url()
    );
    let gw = gateway(&toml).await;
    let deep = "[".repeat(100_000) + &"]".repeat(100_000);
    let headers = [("content-type", "application/json")];
    let json_route = send("POST", gw.http_addr(), "/v1/models/m:predict", &headers, deep.clone()).await;
    assert_eq!(json_route.status, 400, "{}", json_route.text());
    assert!(json_route.text().contains("nests 100000"), "{}", json_route.text());
    let parameters = format!(
        r#"{{"parameters":{{"x":{deep}}},"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1]}}]}}"#
    );
    let kserve = infer(gw.http_addr(), "m", &[], &parameters).await;
    assert_eq!(kserve.status, 400, "{}", kserve.text());
    let shallow = send(
        "POST",
        gw.http_addr(),
        "/v1/models/m:predict",
        &headers,
        r#"{"instances":[[1,2]]}"#,
    )
    .await;
    assert_eq!(shallow.status, 200, "{}", shallow.text());
    assert_eq!(
        rt.sim.stats("m").map_or(0, |s| s.requests),
        1,
        "only the shallow one was sent"
    );
}

/// Route `r` serving `m` on `live`, and route `gone` serving model `gone` on `dead`.
fn live_and_gone(live: &str, dead: std::net::SocketAddr) -> String {
    format!(
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"{live}\"]\n\
         [routes.gone]\nmodels = [\"gone\"]\n[routes.gone.realtime]\nendpoints = [\"http://{dead}\"]\n"
    )
}

#[tokio::test]
async fn every_answer_of_the_http_door_carries_a_request_id() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&live_and_gone(&rt.url(), dead_addr().await)).await;
    let cases = [
        ("GET", "/v2/health/live", 200),
        ("GET", "/v2/health/ready", 200),
        ("GET", "/v2", 200),
        ("GET", "/v2/models/m", 200),
        ("GET", "/v2/models/m/stats", 200),
        ("GET", "/v2/models/stats", 200),
        ("POST", "/v2/repository/index", 200),
        ("GET", "/v2/models/gone", 502),
        ("GET", "/nowhere", 404),
        ("POST", "/v2/repository/models/m/load", 501),
        ("GET", "/v1/files/file-nope", 404),
    ];
    for (method, path, status) in cases {
        let given = send(
            method,
            gw.http_addr(),
            path,
            &[("x-request-id", "req-42")],
            Bytes::new(),
        )
        .await;
        assert_eq!(given.status, status, "{method} {path}: {}", given.text());
        assert_eq!(
            given.header("x-request-id"),
            Some("req-42"),
            "{method} {path} echoes it"
        );
        let made = send(method, gw.http_addr(), path, &[], Bytes::new()).await;
        let id = made.header("x-request-id").unwrap_or_default();
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{method} {path}: {id:?}"
        );
    }
}

#[tokio::test]
async fn statistics_of_every_model_answer_the_models_whose_backends_answer() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&live_and_gone(&rt.url(), dead_addr().await)).await;
    let all = get(gw.http_addr(), "/v2/models/stats").await;
    assert_eq!(all.status, 200, "{}", all.text());
    assert_eq!(
        all.header("x-tiergate-statistics"),
        Some("one-endpoint"),
        "the answer says what its figures count"
    );
    let one = get(gw.http_addr(), "/v2/models/m/stats").await;
    assert_eq!(one.header("x-tiergate-statistics"), Some("one-endpoint"));
    let config = get(gw.http_addr(), "/v2/models/m/config").await;
    assert_eq!(config.header("x-tiergate-statistics"), None, "statistics only");
    let names: Vec<String> = all.json()["model_stats"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|m| m["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        names,
        ["m"],
        "the model whose backend is down is left out, the rest answered"
    );
}

#[tokio::test]
async fn the_batch_api_answers_errors_in_openais_shape_and_tf_serving_keeps_its_own() {
    let rt = backend(&["m"]).await;
    let toml = format!(
        "[routes.r]\nmodels = [\"m\"]\npaths = [\"/v1/models/m:predict\"]\n[routes.r.flags]\noffline = true\n\
         [routes.r.realtime]\nendpoints = [\"{0}\"]\n[routes.r.micro_batch]\nendpoints = [\"{0}\"]\n",
        rt.url()
    );
    let gw = gateway(&toml).await;
    let missing = get(gw.http_addr(), "/v1/files/file-nope").await;
    assert_eq!(missing.status, 404);
    let error = &missing.json()["error"];
    assert_eq!(error["type"], "invalid_request_error", "{}", missing.text());
    assert_eq!(error["code"], "not_found");
    assert!(error["param"].is_null());
    assert!(
        error["message"].as_str().is_some_and(|m| m.contains("file-nope")),
        "{error}"
    );
    let bad = send(
        "POST",
        gw.http_addr(),
        "/v1/batches",
        &[("content-type", "application/json")],
        "{}",
    )
    .await;
    assert_eq!(
        (bad.status, bad.json()["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );
    // TF-Serving's paths are under /v1/ too, and keep TF-Serving's {"error": "..."}.
    let tf = send("POST", gw.http_addr(), "/v1/models/m:predict", &[], "{not json").await;
    assert_eq!(tf.status, 400);
    assert!(tf.json()["error"].is_string(), "{}", tf.text());
}
