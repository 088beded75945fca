//! TLS on the listeners: rustls (ring), the certificate chain and key read from PEM
//! files and read again when they change, without dropping a connection (only new
//! handshakes use the new pair). The HTTP doors offer `h2` and `http/1.1` by ALPN, the
//! gRPC doors `h2`. The admin API may also ask its clients for a certificate signed by
//! a CA of its own (`admin.client_ca_file`).
//!
//! The handshake runs on the connection's own task, after accept, on the socket whose
//! reads carry the first-request deadline ([`super::listen`]): a client that stalls its
//! handshake is closed like one that stalls its request head.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// A certificate and key from files, the newest readable pair served.
#[derive(Debug)]
pub struct Certificate {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: ArcSwap<CertifiedKey>,
}

impl Certificate {
    /// The pair in `cert_file` (a PEM chain, leaf first) and `key_file` (a PEM key).
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, String> {
        let pair = read_pair(cert_file, key_file)?;
        Ok(Arc::new(Certificate {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            current: ArcSwap::from_pointee(pair),
        }))
    }

    /// Reads the pair again whenever either file changes, until `shutdown`; a pair that
    /// does not read (or whose key does not match) is logged, and the one in use stays.
    pub async fn watch(self: Arc<Self>, shutdown: CancellationToken) -> std::io::Result<()> {
        let files = [self.cert_file.clone(), self.key_file.clone()];
        crate::files::on_change(&files, shutdown, || match read_pair(&self.cert_file, &self.key_file) {
            Ok(pair) => {
                tracing::info!(cert = %self.cert_file.display(), "TLS certificate reloaded");
                self.current.store(Arc::new(pair));
            }
            Err(e) => tracing::warn!("TLS certificate not reloaded, the one in use stays: {e}"),
        })
        .await;
        Ok(())
    }

    /// An acceptor serving this certificate with `alpn` (most preferred first), and,
    /// with `client_ca`, only to clients whose certificate that CA signed.
    pub fn acceptor(self: &Arc<Self>, alpn: &[&[u8]], client_ca: Option<&Path>) -> Result<TlsAcceptor, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(file) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in crate::files::certificates(file)? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("{}: not a CA certificate: {e}", file.display()))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(self.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// ALPN for an HTTP door: HTTP/2 first, HTTP/1.1 too.
pub const HTTP_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];
/// ALPN for a gRPC door.
pub const GRPC_ALPN: [&[u8]; 1] = [b"h2"];

fn read_pair(cert_file: &Path, key_file: &Path) -> Result<CertifiedKey, String> {
    let chain = crate::files::certificates(cert_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("{}: cannot read a PEM private key: {e}", key_file.display()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("{}: unsupported private key: {e}", key_file.display()))?;
    let pair = CertifiedKey::new(chain, signing);
    pair.keys_match().map_err(|e| {
        format!(
            "{} and {}: the key is not the certificate's: {e}",
            cert_file.display(),
            key_file.display()
        )
    })?;
    Ok(pair)
}
