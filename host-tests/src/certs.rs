//! Test PKI for the TLS and mTLS tests: a CA, a server and a client
//! certificate it issued, and an unrelated CA for wrong-CA tests.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::BoxError;

/// Every file [`ensure`] writes; if all exist it writes none.
pub const FILES: [&str; 7] = [
    "ca.pem",
    "ca.key",
    "server.pem",
    "server.key",
    "client1.pem",
    "client1.key",
    "other-ca.pem",
];

/// Names the server certificate answers to. example.com is what clients put
/// in SNI / authority overrides; the rest allow direct local connections.
pub const SERVER_NAMES: [&str; 4] = ["example.com", "localhost", "127.0.0.1", "::1"];

/// Where the files go when no directory is given (ignored by git).
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("certs")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    AlreadyPresent,
    Written,
}

/// Writes the PKI into `dir` unless every file is already there. A partial
/// set is regenerated whole, since a key and a certificate from different runs
/// would not match.
pub fn ensure(dir: &Path) -> Result<Outcome, BoxError> {
    if FILES.iter().all(|name| dir.join(name).is_file()) {
        return Ok(Outcome::AlreadyPresent);
    }
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for (name, contents) in generate()? {
        let path = dir.join(name);
        fs::write(&path, contents).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(Outcome::Written)
}

/// The file names and PEM contents of a fresh PKI. Keys are PKCS#8 ECDSA P-256.
pub fn generate() -> Result<Vec<(&'static str, String)>, BoxError> {
    let ca_key = KeyPair::generate()?;
    let ca = ca_params("grpc-wasm test CA")?;
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, &ca_key);

    let server_key = KeyPair::generate()?;
    let server_params = leaf_params(
        "example.com",
        &SERVER_NAMES,
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    let server_pem = server_params.signed_by(&server_key, &issuer)?.pem();

    let client_key = KeyPair::generate()?;
    let client_params = leaf_params("client1", &["client1"], ExtendedKeyUsagePurpose::ClientAuth)?;
    let client_pem = client_params.signed_by(&client_key, &issuer)?.pem();

    // Its key is dropped: it only has to be a CA that signed none of the above.
    let other_key = KeyPair::generate()?;
    let other_pem = ca_params("grpc-wasm unrelated CA")?
        .self_signed(&other_key)?
        .pem();

    Ok(vec![
        ("ca.pem", ca_pem),
        ("ca.key", ca_key.serialize_pem()),
        ("server.pem", server_pem),
        ("server.key", server_key.serialize_pem()),
        ("client1.pem", client_pem),
        ("client1.key", client_key.serialize_pem()),
        ("other-ca.pem", other_pem),
    ])
}

/// Fixed validity, already started and far off, so tests neither wait for a
/// certificate nor see it expire.
fn with_validity(mut params: CertificateParams) -> CertificateParams {
    params.not_before = date_time_ymd(2024, 1, 1);
    params.not_after = date_time_ymd(2049, 12, 31);
    params
}

fn ca_params(common_name: &str) -> Result<CertificateParams, BoxError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "grpc-wasm");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(with_validity(params))
}

fn leaf_params(
    common_name: &str,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> Result<CertificateParams, BoxError> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "grpc-wasm");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    Ok(with_validity(params))
}
