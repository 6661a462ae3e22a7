//! A JSON request as the gRPC frame a server reads, and back: the core
//! from Rust (docs/rust.md shows this file; `make build-tests` compiles it).

use grpc_wasm::json::{json_to_protobuf, protobuf_to_json};
use grpc_wasm::{framing, Compression, JsonOptions, Registry};

const PROTO: &str = r#"syntax = "proto3";
package helloworld;
service Greeter { rpc SayHello (HelloRequest) returns (HelloReply) {} }
message HelloRequest { string name = 1; }
message HelloReply { string message = 1; }
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut registry = Registry::new()?;
    registry.add_sources([("helloworld.proto", PROTO)])?;
    let method = registry.method("/helloworld.Greeter/SayHello")?;
    let options = JsonOptions::default();
    let message = json_to_protobuf(&method.input(), br#"{"name":"rust"}"#, &options)?;
    let frame = framing::encode_frame(&message, Compression::Identity)?;
    println!("{} bytes of gRPC frame", frame.len());
    let json = protobuf_to_json(&method.input(), &message, &options)?;
    println!("{json}");
    Ok(())
}
