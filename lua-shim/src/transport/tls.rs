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
    /// `options.host` gives another): the given CA or [`system_roots`], and
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
            None => roots = system_roots(),
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
                    .map_err(own_certificate_refused)?
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

    pub(crate) fn connection(&self) -> Result<rustls::ClientConnection, TransportError> {
        let mut tls = rustls::ClientConnection::new(self.config.clone(), self.server_name.clone())
            .map_err(|e| TransportError::Tls(e.to_string()))?;
        // h2 writes its preface and a first window of DATA (65,535 bytes)
        // at once, before the handshake ends; rustls holds such plaintext
        // up to 64 KiB by default and refuses the rest, which failed every
        // request over 64 KiB on a fresh TLS connection (gRPC's interop
        // large_unary). Before the handshake only h2's own first window
        // (and the HEADERS of calls started meanwhile) can be written (the
        // server can send nothing that needs an
        // answer yet), and after it the pipe bounds what waits: the same
        // bound holds here, so that nothing is unbounded before it either.
        tls.set_buffer_limit(Some(crate::limits::MAX_UNSENT));
        Ok(tls)
    }
}

/// rustls words a refused client certificate as a peer's ("invalid peer
/// certificate"), though it is the caller's own: say whose it is, and what
/// to do for the usual cause.
fn own_certificate_refused(e: rustls::Error) -> TransportError {
    let reason = match &e {
        rustls::Error::InvalidCertificate(inner) => format!("{inner:?}"),
        other => other.to_string(),
    };
    let hint = if reason.contains("UnsupportedCertVersion") {
        " (an X.509 v1 certificate: rustls takes only v3, so issue it with extensions, e.g. openssl x509 -req -extfile)"
    } else {
        ""
    };
    TransportError::Tls(format!(
        "cert: the client certificate (this connection's own identity) is refused: {reason}{hint}"
    ))
}

/// The roots a connection without a `ca` option trusts: the operating
/// system's store (what its administrator trusts or distrusts), read by
/// rustls-native-certs; only where that store yields no certificate at all
/// (a bare container), the Mozilla roots compiled in by webpki-roots, so
/// that such a machine can still reach public servers.
pub fn system_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(native_certs());
    if roots.is_empty() {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    roots
}

/// The operating system's trusted certificates (`SSL_CERT_FILE` and
/// `SSL_CERT_DIR` override where they are read from).
pub fn native_certs() -> Vec<CertificateDer<'static>> {
    rustls_native_certs::load_native_certs().certs
}

/// A certificate as PEM text, for tonic's configuration, which takes PEM.
pub fn to_pem(cert: &CertificateDer<'_>) -> String {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
    let mut pem = String::with_capacity(encoded.len() + encoded.len() / 64 + 60);
    pem.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in encoded.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_x509_v1_client_certificate_is_named_as_the_callers_own() {
        let options = TlsOptions {
            cert: Some(include_str!("../../tests/data/v1-client.pem").into()),
            key: Some(include_str!("../../tests/data/v1-client.key").into()),
            ..TlsOptions::default()
        };
        let Err(err) = ClientTls::new("localhost", &options) else {
            panic!("a v1 certificate was taken");
        };
        let text = err.to_string();
        assert!(
            text.starts_with("invalid TLS options: cert: the client certificate (this connection's own identity) is refused: "),
            "{text}"
        );
        assert!(text.ends_with("(an X.509 v1 certificate: rustls takes only v3, so issue it with extensions, e.g. openssl x509 -req -extfile)"), "{text}");
        assert!(!text.contains("peer"), "{text}");
    }

    #[test]
    fn the_system_store_is_what_an_unconfigured_connection_trusts() {
        // SSL_CERT_FILE points rustls-native-certs at one file: the store
        // then holds exactly the test CA, with no compiled-in roots beside.
        let certs = std::env::temp_dir().join(format!("grpc-wasm-roots-{}", std::process::id()));
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".to_string()])
            .unwrap()
            .cert
            .pem();
        std::fs::write(&certs, &ca).unwrap();
        // SSL_CERT_DIR would add its directory's certificates to the file's;
        // both are put back as they were.
        let saved = ["SSL_CERT_DIR", "SSL_CERT_FILE"].map(|k| (k, std::env::var_os(k)));
        std::env::remove_var("SSL_CERT_DIR");
        std::env::set_var("SSL_CERT_FILE", &certs);
        let roots = system_roots();
        let native = native_certs();
        for (key, value) in saved {
            match value {
                Some(value) => std::env::set_var(key, value),
                None => std::env::remove_var(key),
            }
        }
        let _ = std::fs::remove_file(&certs);
        assert_eq!(roots.len(), 1);
        assert_eq!(native.len(), 1);
        // The PEM handed to tonic reads back as the same certificate.
        let back = CertificateDer::from_pem_slice(to_pem(&native[0]).as_bytes()).unwrap();
        assert_eq!(back, native[0]);
        assert_eq!(to_pem(&native[0]).trim(), ca.trim());
    }
}
