//! helloworld.Greeter, the classic example service.

use tonic::{Request, Response, Status};

use crate::pb::helloworld::greeter_server::{self, GreeterServer};
use crate::pb::helloworld::{HelloReply, HelloRequest};

#[derive(Debug, Default, Clone, Copy)]
pub struct Greeter;

/// The service, ready for `Server::add_service`.
pub fn service() -> GreeterServer<Greeter> {
    GreeterServer::new(Greeter)
}

#[tonic::async_trait]
impl greeter_server::Greeter for Greeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let name = request.into_inner().name;
        Ok(Response::new(HelloReply {
            message: format!("Hello {name}!"),
        }))
    }
}
