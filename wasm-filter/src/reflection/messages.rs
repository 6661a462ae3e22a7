//! The messages of gRPC server reflection (`grpc.reflection.v1` and
//! `v1alpha`, whose messages are the same on the wire), written from the
//! field numbers the protocol documents. Only what a client sends and
//! reads is here: a client never asks for extensions.

/// `ServerReflectionRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    #[prost(string, tag = "1")]
    pub host: String,
    #[prost(oneof = "Ask", tags = "3, 4, 7")]
    pub ask: Option<Ask>,
}

/// What a request asks for.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Ask {
    /// A file by its name, as another file imports it.
    #[prost(string, tag = "3")]
    FileByFilename(String),
    /// The file that defines a fully qualified symbol (a service here).
    #[prost(string, tag = "4")]
    FileContainingSymbol(String),
    /// The services the server offers (the field's content is ignored).
    #[prost(string, tag = "7")]
    ListServices(String),
}

/// `ServerReflectionResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(oneof = "Answer", tags = "4, 6, 7")]
    pub answer: Option<Answer>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Answer {
    #[prost(message, tag = "4")]
    Files(FileDescriptorResponse),
    #[prost(message, tag = "6")]
    Services(ListServiceResponse),
    #[prost(message, tag = "7")]
    Error(ErrorResponse),
}

/// Encoded `FileDescriptorProto`s: the file asked for, and often the
/// files it imports.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FileDescriptorResponse {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub file_descriptor_proto: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListServiceResponse {
    #[prost(message, repeated, tag = "1")]
    pub service: Vec<ServiceResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServiceResponse {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ErrorResponse {
    #[prost(int32, tag = "1")]
    pub error_code: i32,
    #[prost(string, tag = "2")]
    pub error_message: String,
}
