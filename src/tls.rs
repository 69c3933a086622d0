//! TLS for the listeners: a rustls server configuration (ring provider) from PEM files.

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file could not be read or holds no certificate.
    #[error("tls.cert `{path}`: {reason}")]
    Cert {
        /// The configured `tls.cert` path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The key file could not be read or holds no private key.
    #[error("tls.key `{path}`: {reason}")]
    Key {
        /// The configured `tls.key` path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the pair.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Builds an acceptor from a PEM certificate chain and a PEM private key.
pub fn acceptor(cert_path: &str, key_path: &str) -> Result<TlsAcceptor, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| TlsError::Cert { path: cert_path.into(), reason: e.to_string() })?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Cert { path: cert_path.into(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Cert { path: cert_path.into(), reason: "no certificate found".into() });
    }
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| TlsError::Key { path: key_path.into(), reason: e.to_string() })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
