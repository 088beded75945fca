//! Request payloads and the request template: a KServe v2 infer request for one FP32
//! input `INPUT0` of shape `[rows, cols]`, as JSON tensors or with Triton's binary tensor
//! extension, built once and cloned (cheap `Bytes` clones) for every request.

use anyhow::{bail, Context as _};
use bytes::{BufMut as _, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Uri};
use http_body_util::Full;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Header carrying the client's budget, read by the gateway's classifier.
pub const BUDGET_HEADER: &str = "x-tiergate-budget-ms";
/// Triton binary tensor extension: length of the JSON header that precedes raw tensors.
pub const INFERENCE_HEADER_LENGTH: &str = "inference-header-content-length";
/// Name of the single input tensor.
pub const INPUT_NAME: &str = "INPUT0";

/// Shape and encoding of the infer request body.
#[derive(Clone, Copy, Debug)]
pub struct Payload {
    /// Rows of `INPUT0` (dimension 0, the batch dimension).
    pub rows: usize,
    /// Columns of `INPUT0`.
    pub cols: usize,
    /// Triton binary tensor extension instead of JSON tensors.
    pub binary: bool,
    /// Ask for every output in the binary section (`binary_data_output`), as Triton's
    /// clients do for large tensors.
    pub binary_output: bool,
    /// KServe v2 over gRPC (`ModelInfer`, raw contents) instead of HTTP.
    pub grpc: bool,
    /// Percent of requests (0 to 100) asking a question never asked before (a unique
    /// first value); the rest ask the same one (to measure a cache: `100 - distinct` is
    /// the hit ratio it can reach). Not for gRPC.
    pub distinct: u8,
}

/// What every request of one target carries: URI, headers and the pre-built body.
#[derive(Clone, Debug)]
pub struct Template {
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    distinct: Option<Arc<Distinct>>,
}

/// How a share of requests get a body of their own: the first value of `INPUT0`
/// replaced by the request's number.
#[derive(Debug)]
struct Distinct {
    percent: u64,
    sent: AtomicU64,
    /// Where the first value is: JSON text from `at` to `end`, or raw 4 bytes at `at`.
    at: usize,
    end: Option<usize>,
}

impl Payload {
    /// The deterministic input values: element `k` is `(k mod 251) / 251`.
    pub fn values(&self) -> impl Iterator<Item = f32> {
        (0..self.rows * self.cols).map(|k| (k % 251) as f32 / 251.0)
    }

    /// The body, plus the `Inference-Header-Content-Length` value for binary bodies.
    pub fn encode(&self) -> anyhow::Result<(Bytes, Option<usize>)> {
        let mut input = json!({"name": INPUT_NAME, "shape": [self.rows, self.cols], "datatype": "FP32"});
        let mut request = json!({});
        if self.binary_output {
            request["parameters"] = json!({"binary_data_output": true});
        }
        if !self.binary {
            input["data"] = json!(self.values().collect::<Vec<_>>());
            request["inputs"] = json!([input]);
            return Ok((serde_json::to_vec(&request)?.into(), None));
        }
        let tensor_bytes = self.rows * self.cols * size_of::<f32>();
        input["parameters"] = json!({"binary_data_size": tensor_bytes});
        request["inputs"] = json!([input]);
        let header = serde_json::to_vec(&request)?;
        let mut body = BytesMut::with_capacity(header.len() + tensor_bytes);
        body.put_slice(&header);
        self.values().for_each(|v| body.put_f32_le(v));
        Ok((body.freeze(), Some(header.len())))
    }
}

impl Payload {
    /// One gRPC message frame carrying a `ModelInferRequest` for `model` (raw contents),
    /// encoded field by field as `proto/grpc_service.proto` numbers them.
    pub fn encode_grpc(&self, model: &str) -> Bytes {
        use prost::encoding::{bytes as pb_bytes, int64, string};
        let mut tensor = Vec::new();
        string::encode(1, &INPUT_NAME.to_owned(), &mut tensor);
        string::encode(2, &"FP32".to_owned(), &mut tensor);
        int64::encode_packed(3, &[self.rows as i64, self.cols as i64], &mut tensor);
        let raw: Vec<u8> = self.values().flat_map(f32::to_le_bytes).collect();
        let mut message = Vec::new();
        string::encode(1, &model.to_owned(), &mut message);
        pb_bytes::encode(5, &tensor, &mut message);
        pb_bytes::encode(7, &raw, &mut message);
        let mut frame = BytesMut::with_capacity(5 + message.len());
        frame.put_u8(0); // not compressed
        frame.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
        frame.put_slice(&message);
        frame.freeze()
    }
}

impl Template {
    /// A `POST {base_url}/v2/models/{model}/infer` template; `budget_ms` becomes the
    /// budget header, `extra` headers are added last (and may override the others).
    pub fn new(
        base_url: &str,
        model: &str,
        payload: &Payload,
        budget_ms: Option<u64>,
        extra: &[(HeaderName, HeaderValue)],
    ) -> anyhow::Result<Self> {
        let mut headers = HeaderMap::new();
        let (uri, body, header_length) = if payload.grpc {
            headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
            let uri = join_url(base_url, "/inference.GRPCInferenceService/ModelInfer")?;
            (uri, payload.encode_grpc(model), None)
        } else {
            let (body, header_length) = payload.encode()?;
            (infer_uri(base_url, model)?, body, header_length)
        };
        let content_type = match (payload.grpc, payload.binary) {
            (true, _) => "application/grpc",
            (false, true) => "application/octet-stream",
            (false, false) => "application/json",
        };
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if let Some(len) = header_length {
            headers.insert(INFERENCE_HEADER_LENGTH, HeaderValue::from(len));
        }
        if let Some(ms) = budget_ms {
            headers.insert(BUDGET_HEADER, HeaderValue::from(ms));
        }
        for (name, value) in extra {
            headers.insert(name.clone(), value.clone());
        }
        let distinct = match (payload.distinct, payload.grpc) {
            (0, _) => None,
            (_, true) => bail!("--distinct is for HTTP requests, not gRPC"),
            (p, _) if p > 100 => bail!("--distinct is a percent, 0 to 100"),
            (p, false) => Some(Arc::new(Distinct::of(&body, header_length, p)?)),
        };
        Ok(Self {
            uri,
            headers,
            body,
            distinct,
        })
    }

    /// A fresh request: clones of the URI, the headers and the body's `Bytes` (or, for
    /// the `distinct` share, a body of its own).
    pub fn request(&self) -> Request<Full<Bytes>> {
        let body = match &self.distinct {
            None => self.body.clone(),
            Some(d) => d.body(&self.body),
        };
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        request
    }

    /// The request URI.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }
}

impl Distinct {
    fn of(body: &Bytes, header_length: Option<usize>, percent: u8) -> anyhow::Result<Self> {
        let (at, end) = match header_length {
            Some(len) => (len, None),
            None => {
                let key = b"\"data\":[";
                let at = body
                    .windows(key.len())
                    .position(|w| w == key)
                    .context("the JSON body has no data array")?
                    + key.len();
                let end = at
                    + body[at..]
                        .iter()
                        .position(|b| *b == b',' || *b == b']')
                        .context("no first value")?;
                (at, Some(end))
            }
        };
        Ok(Distinct {
            percent: u64::from(percent),
            sent: AtomicU64::new(0),
            at,
            end,
        })
    }

    /// The next request's body: of its own for `percent` of every hundred, spread
    /// evenly (at 10%, every tenth).
    fn body(&self, shared: &Bytes) -> Bytes {
        let n = self.sent.fetch_add(1, Ordering::Relaxed);
        if (n + 1) * self.percent / 100 == n * self.percent / 100 {
            return shared.clone();
        }
        // Exact in FP32 up to 2^24 requests; past that values repeat.
        let value = (n % (1 << 24)) as f32 + 1.0;
        let mut body = BytesMut::with_capacity(shared.len() + 16);
        body.put_slice(&shared[..self.at]);
        match self.end {
            Some(end) => {
                body.put_slice(format!("{value}").as_bytes());
                body.put_slice(&shared[end..]);
            }
            None => {
                body.put_f32_le(value);
                body.put_slice(&shared[self.at + 4..]);
            }
        }
        body.freeze()
    }
}

/// Joins a base URL (`http://host:port`, optionally with a path prefix) and a path.
pub fn join_url(base_url: &str, path: &str) -> anyhow::Result<Uri> {
    let uri: Uri = format!("{}{path}", base_url.trim_end_matches('/'))
        .parse()
        .with_context(|| format!("invalid URL {base_url:?}"))?;
    match uri.scheme_str() {
        Some("http") => Ok(uri),
        Some(other) => bail!("URL {base_url:?}: scheme {other:?} is not supported (plain http only)"),
        None => bail!("URL {base_url:?}: expected http://host:port"),
    }
}

fn infer_uri(base_url: &str, model: &str) -> anyhow::Result<Uri> {
    if model.is_empty() || model.contains(['/', '?', '#']) {
        bail!("model name {model:?} must be a single non-empty path segment");
    }
    join_url(base_url, &format!("/v2/models/{model}/infer"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn json_body_has_shape_and_deterministic_data() -> anyhow::Result<()> {
        let payload = Payload {
            rows: 2,
            cols: 300,
            binary: false,
            binary_output: false,
            grpc: false,
            distinct: 0,
        };
        let (body, header_length) = payload.encode()?;
        assert_eq!(header_length, None);
        let v: Value = serde_json::from_slice(&body)?;
        let input = &v["inputs"][0];
        assert_eq!(input["name"], INPUT_NAME);
        assert_eq!(input["datatype"], "FP32");
        assert_eq!(input["shape"], json!([2, 300]));
        let data = input["data"].as_array().context("data array")?;
        assert_eq!(data.len(), 600);
        assert_eq!(data[0], json!(0.0));
        assert_eq!(data[251], json!(0.0));
        assert_eq!(data[1].as_f64().map(|x| x as f32), Some(1.0 / 251.0));
        assert_eq!(payload.encode()?.0, body, "same payload, same bytes");
        Ok(())
    }

    #[test]
    fn binary_output_asks_for_every_output_in_the_binary_section() -> anyhow::Result<()> {
        let payload = Payload {
            rows: 1,
            cols: 4,
            binary: true,
            binary_output: true,
            grpc: false,
            distinct: 0,
        };
        let (body, header_len) = payload.encode()?;
        let header: serde_json::Value = serde_json::from_slice(&body[..header_len.expect("binary")])?;
        assert_eq!(header["parameters"]["binary_data_output"], true);
        assert_eq!(body.len(), header_len.expect("binary") + 16);
        Ok(())
    }

    #[test]
    fn a_distinct_share_of_requests_asks_questions_of_its_own() -> anyhow::Result<()> {
        use http_body_util::BodyExt as _;
        for binary in [false, true] {
            let payload = Payload {
                rows: 1,
                cols: 4,
                binary,
                binary_output: false,
                grpc: false,
                distinct: 25,
            };
            let t = Template::new("http://h:1", "m", &payload, None, &[])?;
            let (shared, _) = payload.encode()?;
            let mut bodies = Vec::new();
            for _ in 0..8 {
                let body = futures_body(t.request().into_body().collect())?;
                bodies.push(body);
            }
            let own: Vec<_> = bodies.iter().filter(|b| **b != shared).collect();
            assert_eq!(own.len(), 2, "25 of every 100, spread: the 4th and the 8th");
            assert!(bodies[3] != shared && bodies[7] != shared);
            assert_ne!(own[0], own[1], "each its own");
            assert!(
                own.iter().all(|b| b.len() >= shared.len() - 4),
                "the rest of the body kept"
            );
        }
        Ok(())
    }

    fn futures_body<
        F: std::future::Future<Output = Result<http_body_util::Collected<Bytes>, std::convert::Infallible>>,
    >(
        f: F,
    ) -> anyhow::Result<Bytes> {
        let rt = tokio::runtime::Builder::new_current_thread().build()?;
        Ok(rt.block_on(f).map(|c| c.to_bytes()).unwrap_or_default())
    }

    #[test]
    fn binary_body_is_header_then_little_endian_floats() -> anyhow::Result<()> {
        let payload = Payload {
            rows: 3,
            cols: 4,
            binary: true,
            binary_output: false,
            grpc: false,
            distinct: 0,
        };
        let (body, header_length) = payload.encode()?;
        let header_length = header_length.context("binary bodies declare a header length")?;
        let header: Value = serde_json::from_slice(&body[..header_length])?;
        let input = &header["inputs"][0];
        assert_eq!(input["parameters"]["binary_data_size"], 48);
        assert!(input.get("data").is_none());
        let raw = &body[header_length..];
        assert_eq!(raw.len(), 48);
        assert_eq!(f32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]), 1.0 / 251.0);
        Ok(())
    }

    #[test]
    fn template_sets_uri_and_headers() -> anyhow::Result<()> {
        let extra = [(HeaderName::from_static("x-tenant"), HeaderValue::from_static("a"))];
        let payload = Payload {
            rows: 1,
            cols: 2,
            binary: true,
            binary_output: false,
            grpc: false,
            distinct: 0,
        };
        let t = Template::new("http://127.0.0.1:9/", "resnet50", &payload, Some(200), &extra)?;
        let request = t.request();
        assert_eq!(request.uri(), "http://127.0.0.1:9/v2/models/resnet50/infer");
        assert_eq!(request.method(), Method::POST);
        let h = request.headers();
        assert_eq!(h[BUDGET_HEADER], "200");
        assert_eq!(h["x-tenant"], "a");
        assert_eq!(h[CONTENT_TYPE], "application/octet-stream");
        assert!(h.contains_key(INFERENCE_HEADER_LENGTH));
        let no_budget = Template::new(
            "http://h:1",
            "m",
            &Payload {
                binary: false,
                binary_output: false,
                grpc: false,
                ..payload
            },
            None,
            &[],
        )?;
        assert!(!no_budget.request().headers().contains_key(BUDGET_HEADER));
        Ok(())
    }

    #[test]
    fn rejects_unsupported_urls_and_models() {
        let p = Payload {
            rows: 1,
            cols: 1,
            binary: false,
            binary_output: false,
            grpc: false,
            distinct: 0,
        };
        assert!(Template::new("https://h:1", "m", &p, None, &[]).is_err());
        assert!(Template::new("127.0.0.1:8000", "m", &p, None, &[]).is_err());
        assert!(Template::new("http://h:1", "a/b", &p, None, &[]).is_err());
        assert!(Template::new("http://h:1", "", &p, None, &[]).is_err());
    }
}
