//! grpc.examples.echo.Echo, served in plaintext, TLS or mTLS.
//!
//! Semantics: UnaryEcho returns the message; ServerStreamingEcho returns it
//! three times as "{msg} 0", "{msg} 1", "{msg} 2"; ClientStreamingEcho returns
//! every received message joined with ","; BidirectionalStreamingEcho echoes
//! each message as it arrives.

use std::path::Path;
use std::pin::Pin;

use tokio_stream::{Stream, StreamExt};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::pb::grpc::examples::echo::echo_server::{self, EchoServer};
use crate::pb::grpc::examples::echo::{EchoRequest, EchoResponse};
use crate::BoxError;

/// How many replies ServerStreamingEcho sends.
pub const SERVER_STREAM_REPLIES: usize = 3;

#[derive(Debug, Default, Clone, Copy)]
pub struct Echo;

/// The service, ready for `Server::add_service`.
pub fn service() -> EchoServer<Echo> {
    EchoServer::new(Echo)
}

/// TLS with `dir/server.pem` and `dir/server.key`; with `mtls`, clients must
/// also present a certificate issued by `dir/ca.pem`.
pub fn tls_config(dir: &Path, mtls: bool) -> Result<ServerTlsConfig, BoxError> {
    let cert = read(dir, "server.pem")?;
    let key = read(dir, "server.key")?;
    let config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if !mtls {
        return Ok(config);
    }
    let ca = read(dir, "ca.pem")?;
    Ok(config.client_ca_root(Certificate::from_pem(ca)))
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, BoxError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()).into())
}

fn reply(message: String) -> EchoResponse {
    EchoResponse { message }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl echo_server::Echo for Echo {
    async fn unary_echo(
        &self,
        request: Request<EchoRequest>,
    ) -> Result<Response<EchoResponse>, Status> {
        Ok(Response::new(reply(request.into_inner().message)))
    }

    type ServerStreamingEchoStream = BoxStream<EchoResponse>;

    async fn server_streaming_echo(
        &self,
        request: Request<EchoRequest>,
    ) -> Result<Response<Self::ServerStreamingEchoStream>, Status> {
        let message = request.into_inner().message;
        let replies: Vec<Result<EchoResponse, Status>> = (0..SERVER_STREAM_REPLIES)
            .map(|i| Ok(reply(format!("{message} {i}"))))
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(replies))))
    }

    async fn client_streaming_echo(
        &self,
        request: Request<Streaming<EchoRequest>>,
    ) -> Result<Response<EchoResponse>, Status> {
        let mut inbound = request.into_inner();
        let mut received = Vec::new();
        while let Some(req) = inbound.message().await? {
            received.push(req.message);
        }
        Ok(Response::new(reply(received.join(","))))
    }

    type BidirectionalStreamingEchoStream = BoxStream<EchoResponse>;

    async fn bidirectional_streaming_echo(
        &self,
        request: Request<Streaming<EchoRequest>>,
    ) -> Result<Response<Self::BidirectionalStreamingEchoStream>, Status> {
        let replies = request
            .into_inner()
            .map(|item| item.map(|req| reply(req.message)));
        Ok(Response::new(Box::pin(replies)))
    }
}
