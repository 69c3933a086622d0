//! TLS for the listeners: a rustls server configuration (ring provider) from PEM files,
//! with client certificates verified against a CA when asked (`tls.verify_client`), and
//! the identity a verified client certificate gives (subject, common name).

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

pub(crate) use crate::composition::config::VerifyClient;

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
    /// The client CA file could not be read or holds no usable certificate.
    #[error("tls.client_ca `{path}`: {reason}")]
    ClientCa {
        /// The configured `tls.client_ca` path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The private key does not go with the certificate, or rustls refused the pair.
    #[error("tls.key `{key}` and tls.cert `{cert}`: {reason}")]
    Pair {
        /// The configured `tls.cert` path.
        cert: String,
        /// The configured `tls.key` path.
        key: String,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The identity of a client that presented a verified certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientCert {
    /// The subject as RFC 4514 writes it (last RDN first: `O=client,CN=app`), as RabbitMQ
    /// names an EXTERNAL user.
    pub subject: String,
    /// The subject's common name.
    pub common_name: Option<String>,
}

impl ClientCert {
    /// The identity in a DER certificate (`None` when it does not parse).
    pub(crate) fn from_der(der: &[u8]) -> Option<ClientCert> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let mut parts = Vec::new();
        for rdn in subject.iter().collect::<Vec<_>>().into_iter().rev() {
            let attrs: Vec<String> = rdn
                .iter()
                .filter_map(|a| {
                    let value = a.as_str().ok()?;
                    let name = x509_parser::objects::oid2abbrev(a.attr_type(), x509_parser::objects::oid_registry())
                        .map(str::to_owned)
                        .unwrap_or_else(|_| a.attr_type().to_id_string());
                    Some(format!("{name}={}", escape_rfc4514(value)))
                })
                .collect();
            parts.push(attrs.join("+"));
        }
        let common_name = subject.iter_common_name().next().and_then(|cn| cn.as_str().ok()).map(str::to_owned);
        Some(ClientCert { subject: parts.join(","), common_name })
    }
}

/// Escapes an attribute value as RFC 4514 asks (`,+"\<>;` and a leading `#` or space).
fn escape_rfc4514(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, c) in v.chars().enumerate() {
        if matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') || (i == 0 && (c == '#' || c == ' ')) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Builds an acceptor from a PEM certificate chain and a PEM private key; client
/// certificates are asked for as `verify` says and checked against the CA certificates
/// in `client_ca`.
pub(crate) fn acceptor(
    cert_path: &str,
    key_path: &str,
    client_ca: &str,
    verify: VerifyClient,
) -> Result<TlsAcceptor, TlsError> {
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
    let builder =
        rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match verify {
        VerifyClient::None => builder.with_no_client_auth(),
        VerifyClient::Optional | VerifyClient::Required => {
            let bad = |reason: String| TlsError::ClientCa { path: client_ca.into(), reason };
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(client_ca).map_err(|e| bad(e.to_string()))? {
                roots.add(c.map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(bad("no certificate found".into()));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if verify == VerifyClient::Optional { verifier.allow_unauthenticated() } else { verifier };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| bad(e.to_string()))?)
        }
    };
    let config = builder.with_single_cert(certs, key).map_err(|e| TlsError::Pair {
        cert: cert_path.into(),
        key: key_path.into(),
        reason: match e {
            rustls::Error::InconsistentKeys(_) => "the private key is not the certificate's".into(),
            e => e.to_string(),
        },
    })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4514_escapes_what_would_split_a_name() {
        assert_eq!(escape_rfc4514("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape_rfc4514("#x y"), "\\#x y");
        assert_eq!(escape_rfc4514(" lead"), "\\ lead");
    }
}

/// Why a bridge's TLS client could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("{what} `{path}`: {reason}")]
pub struct ClientTlsError {
    /// The setting (`bridge_cafile`, ...).
    pub what: &'static str,
    /// The path it names.
    pub path: String,
    /// What went wrong.
    pub reason: String,
}

/// The settings a bridge's TLS client is made from, as errors name them.
pub(crate) const BRIDGE_SETTINGS: [&str; 3] = ["bridge_cafile", "bridge_certfile", "bridge_keyfile"];

/// A TLS client (ring provider) that trusts the CA certificates in `ca_file` and, when
/// `cert_file` and `key_file` are given, presents that certificate (a bridge's
/// `bridge_cafile`, `bridge_certfile`, `bridge_keyfile`; a cluster member's `tls.client_ca`,
/// `tls.cert`, `tls.key`: `settings` names them, in that order, for the errors).
/// `any_name` accepts a server certificate that does not name the host (the chain is
/// still checked: Mosquitto's `bridge_insecure`).
pub(crate) fn connector(
    ca_file: &str,
    cert_file: &str,
    key_file: &str,
    any_name: bool,
    settings: [&'static str; 3],
) -> Result<tokio_rustls::TlsConnector, ClientTlsError> {
    let bad = |what: &'static str, path: &str| {
        let path = path.to_owned();
        move |e: String| ClientTlsError { what, path: path.clone(), reason: e }
    };
    let mut roots = rustls::RootCertStore::empty();
    let ca = bad(settings[0], ca_file);
    for c in CertificateDer::pem_file_iter(ca_file).map_err(|e| ca(e.to_string()))? {
        roots.add(c.map_err(|e| ca(e.to_string()))?).map_err(|e| ca(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(ca("no certificate found".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ca(e.to_string()))?;
    let builder = if any_name {
        let chain = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| ca(e.to_string()))?;
        versions.dangerous().with_custom_certificate_verifier(Arc::new(AnyName(chain)))
    } else {
        versions.with_root_certificates(roots)
    };
    let config = if cert_file.is_empty() {
        builder.with_no_client_auth()
    } else {
        let cert = bad(settings[1], cert_file);
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
            .map_err(|e| cert(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| cert(e.to_string()))?;
        let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| bad(settings[2], key_file)(e.to_string()))?;
        builder.with_client_auth_cert(chain, key).map_err(|e| cert(e.to_string()))?
    };
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Checks a server's certificate chain as WebPKI does, but not that it names the host.
#[derive(Debug)]
struct AnyName(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls_pki_types::ServerName<'_>,
        ocsp: &[u8],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
        // The name is checked after the chain: a name error means the chain was good.
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(NotValidForName | NotValidForNameContext { .. })) => {
                Ok(rustls::client::danger::ServerCertVerified::assertion())
            }
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
