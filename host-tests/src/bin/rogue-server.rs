//! A gRPC peer that breaks the protocol on request (`x-rogue` header); see
//! `host_tests::rogue`.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use host_tests::{rogue, serve, BoxError};

#[derive(Parser)]
#[command(about = "A gRPC peer that breaks the protocol as the x-rogue request header asks")]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:50055")]
    addr: SocketAddr,
}

#[tokio::main]
async fn main() -> ExitCode {
    serve::exit_code(run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), BoxError> {
    let shutdown = serve::Shutdown::install()?;
    let listener = serve::bind_and_announce(args.addr).await?;
    tokio::select! {
        result = rogue::serve(listener) => result,
        () = shutdown.wait() => Ok(()),
    }
}
