//! grpcwasm.testing.Testing on `--addr` (default `127.0.0.1:50053`).

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use host_tests::{serve, testing, BoxError};
use tonic::transport::Server;

#[derive(Parser)]
#[command(
    about = "grpcwasm.testing.Testing: failures, delays, metadata and large messages on request"
)]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:50053")]
    addr: SocketAddr,
}

#[tokio::main]
async fn main() -> ExitCode {
    serve::exit_code(run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), BoxError> {
    let router = Server::builder().add_service(testing::service());
    serve::serve(router, args.addr).await
}
