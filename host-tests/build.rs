//! Generates the prost messages and tonic servers/clients from ../protos.
//! protox parses the protos in-process, so no protoc is needed on the machine.

use std::path::PathBuf;

/// The protos these servers speak.
const PROTOS: &[&str] = &[
    "helloworld.proto",
    "library.proto",
    "route_guide.proto",
    "echo.proto",
    "testing.proto",
    "google/rpc/status.proto",
    "google/rpc/error_details.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_dir = manifest.join("../protos");
    println!("cargo:rerun-if-changed={}", proto_dir.display());
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={}", proto_dir.join(proto).display());
    }

    // Encoded, for the reflection service: decoding into prost_types would
    // drop the google.api.http options it must serve.
    let encoded = protox::Compiler::new([&proto_dir])?
        .include_imports(true)
        .open_files(PROTOS)?
        .encode_file_descriptor_set();
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("protos.binpb"), &encoded)?;
    let fds = protox::compile(PROTOS, [&proto_dir])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .include_file("protos.rs")
        .compile_fds(fds)?;
    Ok(())
}
