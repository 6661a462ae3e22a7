//! gRPC server reflection for the test servers (tonic-reflection), serving
//! the encoded files of `../protos` as compiled, options included, so that
//! a client learns the `google.api.http` bindings through it.

use tonic::transport::server::Router;

/// Which reflection services a server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Versions {
    /// `grpc.reflection.v1` only.
    V1,
    /// `grpc.reflection.v1alpha` only, as older servers.
    V1alpha,
    Both,
}

/// The files the servers speak, encoded as protox compiled them.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/protos.binpb"));

/// `router` with the reflection services of `versions` (none for
/// `None`), advertising `services`.
pub fn add(
    router: Router,
    versions: Option<Versions>,
    services: &[&str],
) -> Result<Router, tonic_reflection::server::Error> {
    let builder = || {
        services.iter().fold(
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(DESCRIPTOR_SET),
            |b, s| b.with_service_name(*s),
        )
    };
    let v1 = matches!(versions, Some(Versions::V1 | Versions::Both))
        .then(|| builder().build_v1())
        .transpose()?;
    let v1alpha = matches!(versions, Some(Versions::V1alpha | Versions::Both))
        .then(|| builder().build_v1alpha())
        .transpose()?;
    Ok(router
        .add_optional_service(v1)
        .add_optional_service(v1alpha))
}
