//! grpc.examples.echo.Echo on `--addr` (default `127.0.0.1:50052`), in plaintext,
//! TLS (`--tls-dir`) or mTLS (`--tls-dir` and `--mtls`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use host_tests::{echo, serve, BoxError};
use tonic::transport::Server;

#[derive(Parser)]
#[command(about = "grpc.examples.echo.Echo in plaintext, TLS or mTLS")]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:50052")]
    addr: SocketAddr,
    /// Serve TLS with DIR/server.pem and DIR/server.key (see gen-certs).
    #[arg(long, value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// Also require a client certificate issued by DIR/ca.pem.
    #[arg(long, requires = "tls_dir")]
    mtls: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    serve::exit_code(run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), BoxError> {
    let mut builder = Server::builder();
    if let Some(dir) = &args.tls_dir {
        builder = builder.tls_config(echo::tls_config(dir, args.mtls)?)?;
    }
    let router = builder.add_service(echo::service());
    serve::serve(router, args.addr).await
}
