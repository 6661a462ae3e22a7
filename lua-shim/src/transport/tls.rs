//! rustls client settings for connections whose socket the caller owns
//! (see [`super::wire`]); tonic builds its own from the same options.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::{TlsOptions, TransportError};

#[derive(Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
}

impl ClientTls {
    /// Settings for `addr_host` (the address's host, the server name unless
    /// `options.host` gives another): the given CA or the webpki roots, and
    /// a client certificate for mTLS. HTTP/2 is offered by ALPN.
    pub fn new(addr_host: &str, options: &TlsOptions) -> Result<ClientTls, TransportError> {
        let tls_error = |e: &dyn std::fmt::Display| TransportError::Tls(e.to_string());
        let mut roots = rustls::RootCertStore::empty();
        match options.ca_pem()? {
            Some(ca) => {
                for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                    let cert = cert.map_err(|e| TransportError::Tls(format!("ca: {e}")))?;
                    roots
                        .add(cert)
                        .map_err(|e| TransportError::Tls(format!("ca: {e}")))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error(&e))?
            .with_root_certificates(roots);
        let mut config = match options.identity()? {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| TransportError::Tls(format!("cert: {e}")))?;
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .map_err(|e| TransportError::Tls(format!("priv_key: {e}")))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| tls_error(&e))?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let name = options.host.as_deref().unwrap_or(addr_host);
        let server_name = ServerName::try_from(
            name.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        )
        .map_err(|e| TransportError::Tls(format!("invalid server name '{name}': {e}")))?;
        Ok(ClientTls {
            config: Arc::new(config),
            server_name,
        })
    }

    pub(crate) fn connection(&self) -> Result<rustls::ClientConnection, String> {
        rustls::ClientConnection::new(self.config.clone(), self.server_name.clone())
            .map_err(|e| format!("TLS: {e}"))
    }
}
