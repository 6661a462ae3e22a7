//! Writes the test PKI (CA, server, client1, unrelated CA) into `--out`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use host_tests::certs::{self, Outcome};
use host_tests::{serve, BoxError};

#[derive(Parser)]
#[command(about = "Writes ca, server, client1 and other-ca PEM files; does nothing if all exist")]
struct Args {
    /// Directory for the files (created if missing).
    #[arg(long, value_name = "DIR", default_value_os_t = certs::default_dir())]
    out: PathBuf,
}

fn main() -> ExitCode {
    serve::exit_code(run(Args::parse()))
}

fn run(args: Args) -> Result<(), BoxError> {
    match certs::ensure(&args.out)? {
        Outcome::AlreadyPresent => {
            println!("certificates already present in {}", args.out.display())
        }
        Outcome::Written => println!("wrote certificates to {}", args.out.display()),
    }
    Ok(())
}
