//! routeguide.RouteGuide on `--addr` (default `127.0.0.1:10000`) over `--db`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use host_tests::reflection::{self, Versions};
use host_tests::{route_guide, serve, BoxError};
use tonic::transport::Server;

#[derive(Parser)]
#[command(about = "routeguide.RouteGuide over a JSON feature database")]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:10000")]
    addr: SocketAddr,
    /// JSON array of {"location":{"latitude":..,"longitude":..},"name":..}.
    #[arg(long, default_value_os_t = route_guide::default_db_path())]
    db: PathBuf,
    /// Serve gRPC server reflection too: v1, v1alpha or both.
    #[arg(long, value_enum)]
    reflection: Option<Versions>,
}

#[tokio::main]
async fn main() -> ExitCode {
    serve::exit_code(run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), BoxError> {
    let features = route_guide::load_db(&args.db)?;
    let router = Server::builder().add_service(route_guide::service(features));
    let router = reflection::add(router, args.reflection, &["routeguide.RouteGuide"])?;
    serve::serve(router, args.addr).await
}
