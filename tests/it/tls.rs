//! TLS on the doors and the admin API, with certificates the test makes: HTTP/1.1 and
//! gRPC over TLS, plain text refused on a TLS port, a certificate replaced on disk taken
//! by new handshakes while an open connection goes on, and the admin API asking for a
//! client certificate; backends over TLS (`https://`, `grpcs://`) verified against
//! `backends.ca_file`.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

/// A CA and what it signs.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new() -> Ca {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Ca {
            cert: params.self_signed(&key).expect("CA"),
            key,
        }
    }

    /// A leaf for localhost and 127.0.0.1 (`client`: for client authentication):
    /// its PEM certificate and key.
    fn leaf(&self, client: bool) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
        params.extended_key_usages = vec![match client {
            true => ExtendedKeyUsagePurpose::ClientAuth,
            false => ExtendedKeyUsagePurpose::ServerAuth,
        }];
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("signed");
        (cert.pem(), key.serialize_pem())
    }
}

fn write_pair(dir: &Path, (cert, key): &(String, String)) -> (PathBuf, PathBuf) {
    let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
    // Written whole, then renamed, as an operator's tooling (or a Kubernetes secret) replaces them.
    for (file, text) in [(&key_file, key), (&cert_file, cert)] {
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, file).expect("rename");
    }
    (cert_file, key_file)
}

/// `config` with TLS on its listeners, a certificate `ca` signed written into `dir`.
fn with_tls(mut config: tiergate::config::Config, ca: &Ca, dir: &Path) -> tiergate::config::Config {
    let (cert_file, key_file) = write_pair(dir, &ca.leaf(false));
    config.tls.cert_file = Some(cert_file);
    config.tls.key_file = Some(key_file);
    config
}

fn connector(ca: &Ca, client: Option<&(String, String)>, alpn: &[u8]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert.der().clone()).expect("root");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            use rustls::pki_types::pem::PemObject;
            let chain = vec![CertificateDer::from_pem_slice(cert.as_bytes()).expect("cert")];
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
            builder.with_client_auth_cert(chain, key).expect("client cert")
        }
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn tls_connect(
    connector: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
) -> std::io::Result<TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    connector
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
}

/// One HTTP/1.1 GET of `path` on an open connection: the status line and the body.
async fn http_get(stream: &mut TlsStream<tokio::net::TcpStream>, path: &str, headers: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    // Enough for these small answers: read until the head and a short body are in.
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("answered")
            .expect("read");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if n == 0 || text.contains("\r\n\r\n") && text.contains("content-length: 0") || text.ends_with('}') {
            return text.into_owned();
        }
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if length.is_some_and(|l| body.len() >= l) {
                return text.into_owned();
            }
        }
    }
}

#[tokio::test]
async fn the_doors_speak_tls_and_a_replaced_certificate_is_taken_without_dropping_anyone() {
    let be = backend(&["m"]).await;
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("dir");
    let cfg = with_tls(config(), &ca, dir.path());
    let gw = gateway_with(cfg, &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;

    // HTTP/1.1 over TLS, and a plain-text request refused.
    let http = connector(&ca, None, b"http/1.1");
    let mut open = tls_connect(&http, gw.http_addr()).await.expect("handshake");
    let answer = http_get(&mut open, "/v2/health/ready", "").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let mut plain = tokio::net::TcpStream::connect(gw.http_addr()).await.expect("connect");
    plain
        .write_all(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut got)).await;
    assert!(
        !got.starts_with(b"HTTP/1.1 200"),
        "plain text is not served on a TLS port"
    );

    // gRPC over TLS.
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca.cert.pem()))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", gw.grpc_addr()))
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connects");
    let mut grpc =
        tiergate::protocol::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient::new(channel);
    let reply = grpc.model_infer(common::grpc::fp32_request("g", &[[1.0, 2.0]])).await;
    assert!(reply.is_ok(), "{reply:?}");

    // A new pair on disk: new handshakes get it, the open connection goes on.
    let first = open.get_ref().1.peer_certificates().expect("certs")[0].clone();
    let (new_cert, new_key) = ca.leaf(false);
    write_pair(dir.path(), &(new_cert.clone(), new_key));
    use rustls::pki_types::pem::PemObject;
    let new_der = CertificateDer::from_pem_slice(new_cert.as_bytes()).expect("der");
    assert_ne!(first, new_der);
    eventually(
        Duration::from_secs(10),
        "new handshakes present the new certificate",
        || async {
            let fresh = tls_connect(&http, gw.http_addr()).await.ok()?;
            let presented = fresh.get_ref().1.peer_certificates()?[0].clone();
            (presented == new_der).then_some(())
        },
    )
    .await;
    let again = http_get(&mut open, "/v2/health/live", "").await;
    assert!(
        again.starts_with("HTTP/1.1 200"),
        "the connection opened before goes on: {again}"
    );
}

#[tokio::test]
async fn the_admin_api_can_ask_for_a_client_certificate() {
    let be = backend(&["m"]).await;
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("clients.pem");
    std::fs::write(&ca_file, ca.cert.pem()).expect("ca");
    let mut cfg = with_tls(config(), &ca, dir.path());
    cfg.admin.client_ca_file = Some(ca_file);
    cfg.listen.admin = "127.0.0.1:0".parse().expect("addr");
    cfg.admin.token = Some(tiergate::config::Secret("test-admin-token-0123456789abcdef".into()));
    let gw = gateway_with(cfg, &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    let admin = gw.admin_addr().expect("admin on");
    let token = "authorization: Bearer test-admin-token-0123456789abcdef\r\n";

    let without = connector(&ca, None, b"http/1.1");
    let refused = match tls_connect(&without, admin).await {
        Err(_) => true,
        // TLS 1.3: the server's refusal may arrive with the first read.
        Ok(mut stream) => {
            let request = format!("GET /admin/policy HTTP/1.1\r\nhost: localhost\r\n{token}\r\n");
            let _ = stream.write_all(request.as_bytes()).await;
            let mut got = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got)).await;
            !matches!(read, Ok(Ok(_)) if got.starts_with(b"HTTP/1.1 200"))
        }
    };
    assert!(refused, "no client certificate, no admin API");
    let with = connector(&ca, Some(&ca.leaf(true)), b"http/1.1");
    let mut stream = tls_connect(&with, admin)
        .await
        .expect("handshake with a client certificate");
    let answer = http_get(&mut stream, "/admin/policy", token).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn tls_settings_that_do_not_hold_together_are_refused_at_start() {
    let refusal = |cfg: tiergate::config::Config| async move {
        let policy = policy(&route(
            "http://127.0.0.1:9",
            "http://127.0.0.1:9",
            "realtime = true",
            "",
        ));
        let started = tiergate::app::Gateway::start(&cfg, policy).await;
        started.err().map(|e| e.to_string()).expect("refused")
    };
    let mut cfg = config();
    cfg.tls.cert_file = Some("/nonexistent/cert.pem".into());
    let err = refusal(cfg.clone()).await;
    assert!(err.contains("tls.key_file: is needed with tls.cert_file"), "{err}");
    cfg.tls.key_file = Some("/nonexistent/key.pem".into());
    let err = refusal(cfg).await;
    assert!(err.contains("/nonexistent/cert.pem"), "{err}");
}

/// A policy for models `a`, `b` and `c` on one TLS gateway: `a` over HTTP/1.1 (by host
/// name), `b` over HTTP/2 and `c` over gRPC (by address).
fn tls_backends(http: SocketAddr, grpc: SocketAddr) -> String {
    let (hp, gp) = (http.port(), grpc.port());
    [
        ("a", format!("https://localhost:{hp}"), ""),
        ("b", format!("https://127.0.0.1:{hp}"), "http2 = true"),
        ("c", format!("grpcs://127.0.0.1:{gp}"), ""),
    ]
    .iter()
    .map(|(model, endpoint, extra)| {
        format!(
            "[routes.{model}]\nmodels = [\"{model}\"]\n[routes.{model}.flags]\nrealtime = true\n\
             [routes.{model}.realtime]\nendpoints = [\"{endpoint}\"]\n{extra}\n"
        )
    })
    .collect()
}

#[tokio::test]
async fn backends_over_tls_are_verified_against_the_configured_ca() {
    // The TLS backend: a gateway with TLS on its doors in front of the simulator.
    let be = backend(&["a", "b", "c"]).await;
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("dir");
    let cfg = with_tls(config(), &ca, dir.path());
    let front = format!(
        "[routes.r]\nmodels = [\"a\", \"b\", \"c\"]\n[routes.r.flags]\nrealtime = true\n\
         [routes.r.realtime]\nendpoints = [\"{}\"]\n",
        be.url()
    );
    let tls_backend = gateway_with(cfg, &front).await;
    let toml = tls_backends(tls_backend.http_addr(), tls_backend.grpc_addr());

    // Trusting the CA that signed the backend's certificate: every transport serves.
    let ca_file = dir.path().join("backends-ca.pem");
    std::fs::write(&ca_file, ca.cert.pem()).expect("ca");
    let mut cfg = config();
    cfg.backends.ca_file = Some(ca_file);
    let gw = gateway_with(cfg, &toml).await;
    for model in ["a", "b", "c"] {
        let answer = infer(gw.http_addr(), model, &[], BODY).await;
        assert_eq!(answer.status, 200, "model {model} over TLS: {}", answer.text());
        assert_eq!(answer.json()["model_name"], model, "{}", answer.text());
    }

    // Trusting only the platform's CAs, which did not sign it: refused, and saying why.
    let gw = gateway_with(config(), &toml).await;
    for model in ["a", "b", "c"] {
        let answer = infer(gw.http_addr(), model, &[], BODY).await;
        assert_eq!(answer.status, 502, "model {model}: {}", answer.text());
        let text = answer.text();
        assert!(
            text.contains("invalid peer certificate: UnknownIssuer"),
            "model {model} names the certificate: {text}"
        );
    }
}

#[tokio::test]
async fn a_backend_ca_file_that_does_not_read_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("empty.pem");
    std::fs::write(&ca_file, "").expect("write");
    let mut cfg = config();
    cfg.backends.ca_file = Some(ca_file);
    let policy = policy(&route(
        "https://127.0.0.1:9",
        "https://127.0.0.1:9",
        "realtime = true",
        "",
    ));
    let err = tiergate::app::Gateway::start(&cfg, policy)
        .await
        .err()
        .map(|e| e.to_string())
        .expect("refused");
    assert!(
        err.contains("backends.ca_file") && err.contains("holds no PEM certificate"),
        "{err}"
    );
}
