//! helloworld.Greeter on `--addr` (default `127.0.0.1:50051`).

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use host_tests::reflection::{self, Versions};
use host_tests::{greeter, serve, BoxError};
use tonic::transport::Server;

#[derive(Parser)]
#[command(about = "helloworld.Greeter: SayHello answers \"Hello {name}!\"")]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:50051")]
    addr: SocketAddr,
    /// Serve gRPC server reflection too: v1, v1alpha or both.
    #[arg(long, value_enum)]
    reflection: Option<Versions>,
}

#[tokio::main]
async fn main() -> ExitCode {
    serve::exit_code(run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), BoxError> {
    let router = Server::builder().add_service(greeter::service());
    let router = reflection::add(router, args.reflection, &["helloworld.Greeter"])?;
    serve::serve(router, args.addr).await
}
