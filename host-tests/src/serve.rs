//! Binding, announcing and graceful shutdown shared by every server binary.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::server::{Router, TcpIncoming};

use crate::BoxError;

/// How long in-flight calls get to finish after a shutdown signal. Bounded so
/// that a stuck stream (say a long `Sleep`) cannot keep a harness waiting.
const GRACE: Duration = Duration::from_secs(5);

/// Binds `addr` and only then prints `listening on ADDR` (the bound address,
/// so port 0 works), so a harness that reads the line can connect at once.
pub async fn bind_and_announce(addr: SocketAddr) -> Result<TcpListener, BoxError> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {bound}")?;
    stdout.flush()?;
    Ok(listener)
}

/// Binds, announces and serves `router` until SIGTERM or SIGINT.
pub async fn serve(router: Router, addr: SocketAddr) -> Result<(), BoxError> {
    // Handlers go in before the announcement: a harness may send SIGTERM as
    // soon as it has read the line, and the default action would kill us.
    let shutdown = Shutdown::install()?;
    let listener = bind_and_announce(addr).await?;
    serve_on(router, listener, shutdown.wait()).await
}

/// Serves `router` on an already bound listener until `signal` completes,
/// then gives in-flight calls [`GRACE`] to finish.
pub async fn serve_on(
    router: Router,
    listener: TcpListener,
    signal: impl Future<Output = ()>,
) -> Result<(), BoxError> {
    // Nagle would add latency to every small message in the latency tests.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = router.serve_with_incoming_shutdown(incoming, async {
        let _ = stop_rx.await;
    });
    tokio::pin!(server);

    tokio::select! {
        result = &mut server => return Ok(result?),
        () = signal => {}
    }
    let _ = stop_tx.send(());
    match tokio::time::timeout(GRACE, server).await {
        Ok(result) => Ok(result?),
        Err(_elapsed) => Ok(()),
    }
}

/// SIGTERM (what harnesses send) and SIGINT (ctrl-c at a terminal), caught
/// from the moment [`Shutdown::install`] returns.
pub struct Shutdown {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Shutdown {
    pub fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Shutdown {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Shutdown {})
    }

    /// Completes when either signal arrives.
    pub async fn wait(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Turns a binary's result into its exit code, printing the error with
/// Display (main's default would print Debug, quotes and all).
pub fn exit_code(result: Result<(), BoxError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
