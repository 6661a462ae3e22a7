//! `make demo`: JSON → gRPC → JSON through the core, running as the very
//! .wasm module the proxies load (under wasmtime), against the bundled test
//! servers. The HTTP/2 transport here is tonic's; the protobuf and JSON work
//! is all the module's.
//!
//! Usage: `grpc-demo --greeter ADDR --routeguide ADDR [--wasm PATH]`

use clap::Parser;
use http::uri::PathAndQuery;
use lua_shim::transport::RawCodec;
use lua_shim::CoreModule;
use tonic::transport::{Channel, Endpoint};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:50051")]
    greeter: String,
    #[arg(long, default_value = "127.0.0.1:10000")]
    routeguide: String,
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/grpc_wasm.wasm"))]
    wasm: String,
}

const PROTOS: [(&str, &str); 2] = [
    (
        "helloworld.proto",
        include_str!("../../../protos/helloworld.proto"),
    ),
    (
        "route_guide.proto",
        include_str!("../../../protos/route_guide.proto"),
    ),
];

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let wasm =
        std::fs::read(&args.wasm).map_err(|e| format!("{}: {e} (run `make wasm`)", args.wasm))?;
    let mut core = CoreModule::new(&wasm)?;
    for (name, source) in PROTOS {
        core.load_proto(name, source)?;
    }
    println!("core: {} ({} bytes) under wasmtime", args.wasm, wasm.len());

    let greeter = connect(&args.greeter).await?;
    let routeguide = connect(&args.routeguide).await?;

    unary(
        &mut core,
        greeter,
        "/helloworld.Greeter/SayHello",
        ("helloworld.HelloRequest", "helloworld.HelloReply"),
        r#"{"name":"grpc-wasm"}"#,
    )
    .await?;
    unary(
        &mut core,
        routeguide.clone(),
        "/routeguide.RouteGuide/GetFeature",
        ("routeguide.Point", "routeguide.Feature"),
        r#"{"latitude":409012345,"longitude":-742567890}"#,
    )
    .await?;
    list_features(&mut core, routeguide).await
}

async fn connect(addr: &str) -> Result<Channel, Box<dyn std::error::Error>> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?)
}

async fn unary(
    core: &mut CoreModule,
    channel: Channel,
    path: &'static str,
    (input, output): (&str, &str),
    json: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let request = core.json_to_proto(input, json.as_bytes())?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let reply = grpc
        .unary(
            tonic::Request::new(request),
            PathAndQuery::from_static(path),
            RawCodec,
        )
        .await?
        .into_inner();
    let reply = core.proto_to_json(output, &reply)?;
    println!(
        "{path}\n  request  {json}\n  response {}",
        String::from_utf8_lossy(&reply)
    );
    Ok(())
}

async fn list_features(
    core: &mut CoreModule,
    channel: Channel,
) -> Result<(), Box<dyn std::error::Error>> {
    let path = "/routeguide.RouteGuide/ListFeatures";
    let json = r#"{"lo":{"latitude":400000000,"longitude":-750000000},"hi":{"latitude":420000000,"longitude":-730000000}}"#;
    let request = core.json_to_proto("routeguide.Rectangle", json.as_bytes())?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let mut stream = grpc
        .server_streaming(
            tonic::Request::new(request),
            PathAndQuery::from_static(path),
            RawCodec,
        )
        .await?
        .into_inner();
    println!("{path} (server streaming)\n  request  {json}");
    let mut count = 0;
    while let Some(message) = stream.message().await? {
        count += 1;
        if count <= 3 {
            let feature = core.proto_to_json("routeguide.Feature", &message)?;
            println!("  response {}", String::from_utf8_lossy(&feature));
        }
    }
    println!("  ... {count} features in all");
    Ok(())
}
