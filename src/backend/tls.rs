//! TLS to backends (`https://` and `grpcs://` endpoints): rustls (ring), verifying each
//! endpoint's certificate against the CA certificates of `backends.ca_file`, or the
//! platform's when it is not set, for the endpoint's host name or address (SNI). Beside
//! the transports: `h1` opens its own TLS connections with [`Trust::tls`], `h2` takes a
//! hyper-rustls connector from [`Trust::connector`], `grpc` tonic's settings from
//! [`Trust::grpc`].

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::uri::Authority;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::ServerName;
use tokio_rustls::TlsConnector;

/// The CA certificates backends' certificates must chain to.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// `None`: the platform's, read when a TLS pool is first built.
    roots: Option<Arc<RootCertStore>>,
}

impl Trust {
    /// The platform's CA certificates (`/etc/ssl/certs` and the like, as OpenSSL finds
    /// them; `SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured).
    pub fn platform() -> Self {
        Trust { roots: None }
    }

    /// Only the CA certificates in `file` (PEM, one or more).
    pub fn from_file(file: &Path) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        for cert in crate::files::certificates(file)? {
            roots
                .add(cert)
                .map_err(|e| format!("{}: not a CA certificate: {e}", file.display()))?;
        }
        Ok(Trust {
            roots: Some(Arc::new(roots)),
        })
    }

    /// A TLS connector offering `alpn` (empty: none).
    pub(super) fn tls(&self, alpn: &[&[u8]]) -> TlsConnector {
        let mut config = self.config();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        TlsConnector::from(Arc::new(config))
    }

    /// A connector for hyper-util's client and tonic: TLS for `https` URIs with ALPN
    /// `h2`, plain TCP for `http` ones; TCP connects within `connect_timeout`.
    pub(super) fn connector(&self, connect_timeout: Duration) -> HttpsConnector<HttpConnector> {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(connect_timeout));
        tcp.enforce_http(false);
        hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(self.config())
            .https_or_http()
            .enable_http2()
            .wrap_connector(tcp)
    }

    /// tonic's TLS settings for a `grpcs://` endpoint at `authority`: the same CA
    /// certificates, its host as the server name.
    pub(super) fn grpc(&self, authority: &Authority) -> tonic::transport::ClientTlsConfig {
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        tonic::transport::ClientTlsConfig::new()
            .trust_anchors(self.roots().roots.iter().cloned())
            .domain_name(host)
    }

    fn roots(&self) -> Arc<RootCertStore> {
        self.roots.clone().unwrap_or_else(platform_roots)
    }

    fn config(&self) -> ClientConfig {
        let roots = self.roots();
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth()
    }
}

/// How `h1` opens TLS to one endpoint: a connector, and the name the endpoint's
/// certificate must carry (its host name or IP address).
#[derive(Clone)]
pub(super) struct Handshake {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl Handshake {
    /// TLS with `connector` to the endpoint at `authority`.
    pub(super) fn to(connector: &TlsConnector, authority: &Authority) -> Result<Self, String> {
        Ok(Handshake {
            connector: connector.clone(),
            name: server_name(authority)?,
        })
    }

    /// The TLS session over `stream`, the endpoint's certificate verified.
    pub(super) async fn open<S>(&self, stream: S) -> std::io::Result<tokio_rustls::client::TlsStream<S>>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        self.connector.connect(self.name.clone(), stream).await
    }
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The name an endpoint's certificate must carry: its host name or IP address.
fn server_name(authority: &Authority) -> Result<ServerName<'static>, String> {
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).map_err(|e| format!("{host:?} is not a TLS server name: {e}"))
}

/// The platform's CA certificates, read once; those that do not read are logged.
fn platform_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!("a platform CA certificate was not read: {e}");
            }
            let mut roots = RootCertStore::empty();
            let (added, refused) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(
                    refused,
                    "no platform CA certificates: TLS backends will fail verification; set backends.ca_file"
                );
            }
            Arc::new(roots)
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_are_host_names_or_addresses() {
        let name = |a: &str| server_name(&a.parse().expect("authority")).map(|n| n.to_str().into_owned());
        assert_eq!(name("triton.internal:8000").as_deref(), Ok("triton.internal"));
        assert_eq!(name("10.0.0.5:8000").as_deref(), Ok("10.0.0.5"));
        assert_eq!(name("[::1]:8443").as_deref(), Ok("::1"));
    }

    #[test]
    fn a_ca_file_that_holds_no_certificate_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("ca.pem");
        std::fs::write(&file, "not a certificate\n").expect("write");
        let err = Trust::from_file(&file).expect_err("no certificate");
        assert!(err.contains("ca.pem") && err.contains("no PEM certificate"), "{err}");
    }
}
