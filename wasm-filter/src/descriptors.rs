//! The descriptor pool: `.proto` sources compiled at run time with protox, or
//! binary `FileDescriptorSet`s, plus the files every user expects to import
//! without supplying them.

#[cfg(feature = "compiler")]
use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::sync::Arc;

use prost::Message;
use prost_reflect::{DescriptorPool, MessageDescriptor, MethodDescriptor};
#[cfg(feature = "compiler")]
use protox::file::{File, FileResolver, GoogleFileResolver};

use crate::error::Error;
use crate::json::MessageType;

/// google/api and google/rpc files, written for this project and bundled so
/// that `import "google/api/annotations.proto"` just works. The well-known
/// google/protobuf types come with protox.
#[cfg(feature = "compiler")]
const BUNDLED: [(&str, &str); 6] = [
    (
        "google/api/http.proto",
        include_str!("../../protos/google/api/http.proto"),
    ),
    (
        "google/api/annotations.proto",
        include_str!("../../protos/google/api/annotations.proto"),
    ),
    (
        "google/api/httpbody.proto",
        include_str!("../../protos/google/api/httpbody.proto"),
    ),
    (
        "google/rpc/status.proto",
        include_str!("../../protos/google/rpc/status.proto"),
    ),
    (
        "google/rpc/code.proto",
        include_str!("../../protos/google/rpc/code.proto"),
    ),
    (
        "google/rpc/error_details.proto",
        include_str!("../../protos/google/rpc/error_details.proto"),
    ),
];

/// Loaded up front: status details are decoded with them whatever the user loads.
#[cfg(all(test, feature = "compiler"))]
const PRELOADED: [&str; 2] = ["google/rpc/status.proto", "google/rpc/error_details.proto"];

/// The `PRELOADED` files and their imports, compiled: what every registry starts
/// with, so that a build without the compiler (descriptor sets only) has
/// them too. A test checks it against a fresh compile
/// (`UPDATE_BUNDLED=1 cargo test -p grpc-wasm bundled` rewrites it).
const PRELOADED_SET: &[u8] = include_bytes!("preloaded.binpb");

/// How a method streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamingKind {
    Unary,
    ServerStreaming,
    ClientStreaming,
    Bidirectional,
}

/// A method found by its path.
#[derive(Debug, Clone)]
pub struct Method {
    descriptor: MethodDescriptor,
    /// Kept: a transcoded request needs it as its `:path`.
    path: Arc<str>,
    // Decided once when the method is loaded, not on every call.
    streaming: StreamingKind,
    input: MessageType,
    output: MessageType,
}

impl Method {
    fn new(descriptor: MethodDescriptor) -> Method {
        let path = format!(
            "/{}/{}",
            descriptor.parent_service().full_name(),
            descriptor.name()
        );
        let streaming = match (
            descriptor.is_client_streaming(),
            descriptor.is_server_streaming(),
        ) {
            (false, false) => StreamingKind::Unary,
            (false, true) => StreamingKind::ServerStreaming,
            (true, false) => StreamingKind::ClientStreaming,
            (true, true) => StreamingKind::Bidirectional,
        };
        Method {
            input: MessageType::new(descriptor.input()),
            output: MessageType::new(descriptor.output()),
            descriptor,
            path: path.into(),
            streaming,
        }
    }

    /// `/pkg.Service/Method`, the HTTP/2 `:path` of a call.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `pkg.Service`.
    pub fn service_name(&self) -> &str {
        self.descriptor.parent_service().full_name()
    }

    /// The bare method name.
    pub fn name(&self) -> &str {
        self.descriptor.name()
    }

    pub fn input(&self) -> MessageDescriptor {
        self.descriptor.input()
    }

    pub fn output(&self) -> MessageDescriptor {
        self.descriptor.output()
    }

    /// The request type, with its codec's choices made.
    pub fn input_type(&self) -> &MessageType {
        &self.input
    }

    /// The response type, with its codec's choices made.
    pub fn output_type(&self) -> &MessageType {
        &self.output
    }

    pub fn streaming(&self) -> StreamingKind {
        self.streaming
    }

    pub fn descriptor(&self) -> &MethodDescriptor {
        &self.descriptor
    }
}

/// Every message, service and method a host has loaded.
#[derive(Debug, Clone)]
pub struct Registry {
    pool: DescriptorPool,
}

impl Registry {
    /// A registry holding only the bundled status and error-detail types.
    pub fn new() -> Result<Self, Error> {
        let mut registry = Registry {
            pool: DescriptorPool::new(),
        };
        registry.add_descriptor_set(PRELOADED_SET)?;
        Ok(registry)
    }

    /// The names of the files every registry bundles (google/protobuf,
    /// google/api, google/rpc): a loader need not ask a server for them.
    pub fn bundled_files() -> Vec<String> {
        Registry::new()
            .map(|r| r.pool.files().map(|f| f.name().to_string()).collect())
            .unwrap_or_default()
    }

    /// Compiles `.proto` sources given as (file name, contents). Imports are
    /// resolved among these files, files loaded before, and the bundled
    /// google/protobuf, google/api and google/rpc files.
    #[cfg(feature = "compiler")]
    pub fn add_sources<'a>(
        &mut self,
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<(), Error> {
        let files: Vec<(&str, &str)> = files.into_iter().collect();
        let names: Vec<&str> = files.iter().map(|(name, _)| *name).collect();
        crate::json::forget_layouts(&self.pool);
        self.compile(files, names)
    }

    /// Adds the files of a binary `google.protobuf.FileDescriptorSet`.
    pub fn add_descriptor_set(&mut self, bytes: &[u8]) -> Result<(), Error> {
        crate::json::forget_layouts(&self.pool);
        self.add_new_files(bytes).map_err(Error::DescriptorSet)
    }

    /// Looks up `/pkg.Service/Method` (the leading slash is optional).
    pub fn method(&self, path: &str) -> Result<Method, Error> {
        let trimmed = path.strip_prefix('/').unwrap_or(path);
        let (service, method) = trimmed
            .rsplit_once('/')
            .filter(|(s, m)| !s.is_empty() && !m.is_empty())
            .ok_or_else(|| Error::InvalidMethodPath(path.to_string()))?;
        let service = self
            .pool
            .get_service_by_name(service)
            .ok_or_else(|| Error::UnknownService(service.to_string()))?;
        let descriptor = service
            .methods()
            .find(|m| m.name() == method)
            .ok_or_else(|| Error::UnknownMethod(format!("/{}/{}", service.full_name(), method)))?;
        Ok(Method::new(descriptor))
    }

    /// Every method of every service, keyed by its path, for lookups that
    /// are made on each request.
    pub fn methods_by_path(&self) -> FxHashMap<Box<str>, Method> {
        self.pool
            .services()
            .flat_map(|service| service.methods().collect::<Vec<_>>())
            .map(Method::new)
            .map(|m| (m.path().into(), m))
            .collect()
    }

    /// Looks up a message type by its full name, e.g. `routeguide.Point`.
    pub fn message(&self, full_name: &str) -> Result<MessageDescriptor, Error> {
        let name = full_name.strip_prefix('.').unwrap_or(full_name);
        self.pool
            .get_message_by_name(name)
            .ok_or_else(|| Error::UnknownMessage(full_name.to_string()))
    }

    pub fn pool(&self) -> &DescriptorPool {
        &self.pool
    }

    /// Everything loaded, as a binary `FileDescriptorSet`.
    pub fn encode_descriptor_set(&self) -> Vec<u8> {
        // The pool's own encoding keeps the options' extensions (such as
        // google.api.http); prost_types would drop them.
        self.pool.encode_to_vec()
    }

    #[cfg(feature = "compiler")]
    fn compile<'a>(
        &mut self,
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
        open: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), Error> {
        let sources: HashMap<String, String> = files
            .into_iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect();
        // The resolver must own what it reads; a pool clone is a reference count.
        let resolver = Resolver {
            sources,
            pool: self.pool.clone(),
            google: GoogleFileResolver::new(),
        };
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        // Source info gives checker errors (unknown types, duplicate names)
        // their line and column.
        compiler.include_source_info(true).include_imports(true);
        for name in open {
            compiler.open_file(name).map_err(compile_error)?;
        }
        // Encoded, not as prost_types: prost_types drops the extension
        // values in options (such as google.api.http), the encoding keeps them.
        let set = compiler.encode_file_descriptor_set();
        self.add_new_files(&set).map_err(Error::Proto)
    }

    /// Adds the files of an encoded FileDescriptorSet that the pool does not
    /// have yet (a shared import is kept once), without source info, which
    /// only compile errors need. Works on the encoding so that options keep
    /// their extensions.
    fn add_new_files(&mut self, set: &[u8]) -> Result<(), String> {
        let mut fresh = Vec::with_capacity(set.len());
        let mut heads = Vec::new();
        for file in wire::records(set, 1).map_err(|e| format!("malformed descriptor set: {e}"))? {
            let name = wire::string_field(file, 1)
                .map_err(|e| format!("malformed file descriptor: {e}"))?;
            if self.pool.get_file_by_name(&name).is_some() {
                continue;
            }
            check_syntax(&name, file)?;
            heads.push(
                FileImports::decode(file).map_err(|e| format!("malformed file descriptor: {e}"))?,
            );
            let kept = wire::without_field(file, 9)
                .map_err(|e| format!("malformed file descriptor: {e}"))?;
            push_file(&mut fresh, &kept);
        }
        if fresh.is_empty() {
            return Ok(());
        }
        check_public_imports(&self.pool, &heads)?;
        self.pool
            .decode_file_descriptor_set(fresh.as_slice())
            .map_err(|e| e.to_string())
    }
}

/// The files of an encoded `FileDescriptorSet`, each with its name, as
/// they are encoded: for hosts that keep sets file by file.
pub fn set_files(set: &[u8]) -> Result<Vec<(String, &[u8])>, String> {
    wire::records(set, 1)
        .map_err(|e| format!("malformed descriptor set: {e}"))?
        .into_iter()
        .map(|file| {
            let name = wire::string_field(file, 1)
                .map_err(|e| format!("malformed file descriptor: {e}"))?;
            Ok((name, file))
        })
        .collect()
}

/// Appends an encoded `FileDescriptorProto` to an encoded set.
pub fn push_file(set: &mut Vec<u8>, file: &[u8]) {
    prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, set);
    prost::encoding::encode_varint(file.len() as u64, set);
    set.extend_from_slice(file);
}

/// What a `FileDescriptorProto` imports: all a loader needs to close a
/// set, and all the public-import walk needs.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct FileImports {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "3")]
    pub dependency: Vec<String>,
    #[prost(int32, repeated, tag = "10")]
    pub public_dependency: Vec<i32>,
}

/// The most steps prost-reflect may take to follow public imports when a
/// set is added: no real set comes near it.
const MAX_PUBLIC_IMPORT_STEPS: usize = 100_000;

/// Refuses a set whose public imports prost-reflect 0.16 would take
/// unbounded time to follow: it walks again into every file it has met
/// already (its test of a set insertion is the wrong way round), so each
/// file of a chain of public imports doubles the work, and 40 small files
/// would never finish. This walk is its walk, step by step, stopped at
/// [`MAX_PUBLIC_IMPORT_STEPS`]. (Until a prost-reflect release walks each
/// file once.)
fn check_public_imports(pool: &DescriptorPool, new: &[FileImports]) -> Result<(), String> {
    let old: Vec<FileImports> = pool
        .files()
        .map(|f| {
            let proto = f.file_descriptor_proto();
            FileImports {
                name: proto.name().to_string(),
                dependency: proto.dependency.clone(),
                public_dependency: proto.public_dependency.clone(),
            }
        })
        .collect();
    let files: FxHashMap<&str, &FileImports> = old
        .iter()
        .chain(new)
        .map(|f| (f.name.as_str(), f))
        .collect();
    let mut steps = 0usize;
    for file in new {
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        seen.insert(&file.name);
        for dependency in &file.dependency {
            if let Some(next) = files.get(dependency.as_str()) {
                seen.insert(&next.name);
                walk_public(next, &files, &mut seen, &mut steps).map_err(|()| {
                    format!(
                        "{}: its public imports take more than {MAX_PUBLIC_IMPORT_STEPS} steps to follow",
                        file.name
                    )
                })?;
            }
        }
    }
    Ok(())
}

/// prost-reflect's recursion, as a loop (its depth is the step count's).
fn walk_public<'a>(
    file: &'a FileImports,
    files: &FxHashMap<&'a str, &'a FileImports>,
    seen: &mut std::collections::HashSet<&'a str>,
    steps: &mut usize,
) -> Result<(), ()> {
    let mut stack = vec![(file, 0usize)];
    *steps += 1;
    while let Some((file, at)) = stack.pop() {
        let Some(dependency) = file.dependency.get(at) else {
            continue;
        };
        stack.push((file, at + 1));
        let Some(next) = files.get(dependency.as_str()) else {
            continue;
        };
        let public = i32::try_from(at).is_ok_and(|i| file.public_dependency.contains(&i));
        // As prost-reflect: on into a file only when it was met before.
        if public && !seen.insert(&next.name) {
            *steps += 1;
            if *steps > MAX_PUBLIC_IMPORT_STEPS {
                return Err(());
            }
            stack.push((next, 0));
        }
    }
    Ok(())
}

/// Refuses a `syntax` that prost-reflect does not know: 0.16 panics on one
/// (labelling its own error indexes past the files it has built) instead
/// of returning the error, and in the module a panic is a trap.
fn check_syntax(name: &str, file: &[u8]) -> Result<(), String> {
    let syntax = wire::records(file, 12).map_err(|e| format!("malformed file descriptor: {e}"))?;
    match syntax.last() {
        None => Ok(()),
        Some(&known) if known == b"proto2" || known == b"proto3" => Ok(()),
        Some(other) => Err(format!(
            "{name}: unknown syntax '{}' (expected proto2 or proto3)",
            String::from_utf8_lossy(other)
        )),
    }
}

/// Just enough wire-format reading to pick files out of a descriptor set.
mod wire {
    use prost::encoding::{decode_key, decode_varint, WireType};

    /// One record: its field number, the whole record, and the payload of a
    /// length-delimited field.
    type Record<'a> = (u32, &'a [u8], Option<&'a [u8]>);

    fn skip(wire_type: WireType, buf: &mut &[u8]) -> Result<(), String> {
        let n = match wire_type {
            WireType::Varint => return decode_varint(buf).map(drop).map_err(|e| e.to_string()),
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => decode_varint(buf).map_err(|e| e.to_string())? as usize,
            _ => return Err("groups are not used in descriptors".into()),
        };
        if n > buf.len() {
            return Err("truncated".into());
        }
        *buf = &buf[n..];
        Ok(())
    }

    /// Every record of the message as (field number, whole record, payload
    /// for length-delimited fields).
    fn each(mut buf: &[u8]) -> Result<Vec<Record<'_>>, String> {
        let mut out = Vec::new();
        while !buf.is_empty() {
            let start = buf;
            let (number, wire_type) = decode_key(&mut buf).map_err(|e| e.to_string())?;
            let body = buf;
            skip(wire_type, &mut buf)?;
            let record = &start[..start.len() - buf.len()];
            let payload = (wire_type == WireType::LengthDelimited).then(|| {
                let mut b = body;
                let len = decode_varint(&mut b).unwrap_or(0) as usize;
                &b[..len.min(b.len())]
            });
            out.push((number, record, payload));
        }
        Ok(out)
    }

    pub fn records(buf: &[u8], number: u32) -> Result<Vec<&[u8]>, String> {
        Ok(each(buf)?
            .into_iter()
            .filter(|r| r.0 == number)
            .filter_map(|r| r.2)
            .collect())
    }

    pub fn string_field(buf: &[u8], number: u32) -> Result<String, String> {
        let value = records(buf, number)?.pop().unwrap_or_default();
        Ok(String::from_utf8_lossy(value).into_owned())
    }

    pub fn without_field(buf: &[u8], number: u32) -> Result<Vec<u8>, String> {
        Ok(each(buf)?
            .into_iter()
            .filter(|r| r.0 != number)
            .flat_map(|r| r.1.iter().copied())
            .collect())
    }
}

/// The files a `.proto` source imports, in order: hosts that read sources
/// from disk resolve them first. A syntax error names the file, line and
/// column, as a compile error does.
#[cfg(feature = "compiler")]
pub fn imports_of(name: &str, source: &str) -> Result<Vec<String>, Error> {
    let file = File::from_source(name, source).map_err(compile_error)?;
    Ok(file.file_descriptor_proto().dependency.clone())
}

/// protox's Debug output is `file:line:column: message`, the form users can act on.
#[cfg(feature = "compiler")]
fn compile_error(err: protox::Error) -> Error {
    Error::Proto(format!("{err:?}"))
}

#[cfg(feature = "compiler")]
struct Resolver {
    sources: HashMap<String, String>,
    pool: DescriptorPool,
    google: GoogleFileResolver,
}

#[cfg(feature = "compiler")]
impl FileResolver for Resolver {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        if let Some(source) = self.sources.get(name) {
            return File::from_source(name, source);
        }
        if let Some(file) = self.pool.get_file_by_name(name) {
            return Ok(File::from_file_descriptor_proto(
                file.file_descriptor_proto().clone(),
            ));
        }
        if let Some((_, source)) = BUNDLED.iter().find(|(n, _)| *n == name) {
            return File::from_source(name, source);
        }
        self.google.open_file(name)
    }
}

impl Default for Registry {
    /// Infallible in practice: the bundled files are part of the build and
    /// covered by tests. Should they ever fail, an empty pool is returned.
    fn default() -> Self {
        Registry::new().unwrap_or(Registry {
            pool: DescriptorPool::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_preloaded_set_is_current() {
        let mut fresh = Registry {
            pool: DescriptorPool::new(),
        };
        let none: [(&str, &str); 0] = [];
        fresh.compile(none, PRELOADED).unwrap();
        let encoded = fresh.encode_descriptor_set();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/preloaded.binpb");
        if std::env::var_os("UPDATE_BUNDLED").is_some() {
            std::fs::write(path, &encoded).unwrap();
        }
        assert!(
            encoded == PRELOADED_SET,
            "src/preloaded.binpb is stale: UPDATE_BUNDLED=1 cargo test -p grpc-wasm bundled"
        );
        let names: Vec<String> = Registry::new()
            .unwrap()
            .pool()
            .files()
            .map(|f| f.name().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "google/protobuf/any.proto",
                "google/rpc/status.proto",
                "google/protobuf/duration.proto",
                "google/rpc/error_details.proto"
            ]
        );
    }

    const HELLO: &str = include_str!("../../protos/helloworld.proto");
    const ROUTE: &str = include_str!("../../protos/route_guide.proto");

    #[cfg(feature = "compiler")]
    #[test]
    fn a_syntax_error_among_imports_names_its_file_line_and_column() {
        let source = "syntax = \"proto3\";\nimport \"a.proto\";\nmessage M {\n  int32 m = 1\n  int64 n = 2;\n}\n";
        assert_eq!(
            imports_of("shop/v1/catalog.proto", source)
                .unwrap_err()
                .to_string(),
            "shop/v1/catalog.proto:5:3: expected ';' or '[', but found 'int64'"
        );
        let fine = source.replace("= 1\n", "= 1;\n");
        assert_eq!(
            imports_of("shop/v1/catalog.proto", &fine).unwrap(),
            ["a.proto"]
        );
    }

    #[test]
    fn looks_up_methods_and_streaming_kinds() {
        let mut r = Registry::new().unwrap();
        r.add_sources([("helloworld.proto", HELLO), ("route_guide.proto", ROUTE)])
            .unwrap();
        let m = r.method("/helloworld.Greeter/SayHello").unwrap();
        assert_eq!(m.input().full_name(), "helloworld.HelloRequest");
        assert_eq!(m.output().full_name(), "helloworld.HelloReply");
        assert_eq!(m.streaming(), StreamingKind::Unary);
        assert_eq!(m.path(), "/helloworld.Greeter/SayHello");
        assert_eq!(m.service_name(), "helloworld.Greeter");
        let kinds: Vec<_> = ["GetFeature", "ListFeatures", "RecordRoute", "RouteChat"]
            .iter()
            .map(|n| {
                r.method(&format!("/routeguide.RouteGuide/{n}"))
                    .unwrap()
                    .streaming()
            })
            .collect();
        assert_eq!(
            kinds,
            [
                StreamingKind::Unary,
                StreamingKind::ServerStreaming,
                StreamingKind::ClientStreaming,
                StreamingKind::Bidirectional
            ]
        );
    }

    #[test]
    fn unknown_names_are_named_in_the_error() {
        let mut r = Registry::new().unwrap();
        r.add_sources([("helloworld.proto", HELLO)]).unwrap();
        assert_eq!(
            r.method("/helloworld.Greeter/SayBye")
                .unwrap_err()
                .to_string(),
            "unknown method '/helloworld.Greeter/SayBye'"
        );
        assert_eq!(
            r.method("/helloworld.Nope/SayHello")
                .unwrap_err()
                .to_string(),
            "unknown service 'helloworld.Nope'"
        );
        assert_eq!(
            r.method("SayHello").unwrap_err().to_string(),
            "invalid method path 'SayHello': expected /package.Service/Method"
        );
        assert_eq!(
            r.message("helloworld.Nope").unwrap_err().to_string(),
            "unknown message type 'helloworld.Nope'"
        );
    }

    #[test]
    fn syntax_errors_carry_file_line_and_column() {
        let mut r = Registry::new().unwrap();
        let bad = "syntax = \"proto3\";\nmessage A {\n  int32 x = ;\n}\n";
        let err = r.add_sources([("bad.proto", bad)]).unwrap_err().to_string();
        assert!(err.starts_with("bad.proto:3:13: "), "{err}");
        let unknown_type = "syntax = \"proto3\";\nmessage A {\n  Missing x = 1;\n}\n";
        let err = r
            .add_sources([("types.proto", unknown_type)])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("types.proto:3:3: "), "{err}");
        assert!(err.contains("Missing"), "{err}");
    }

    #[test]
    fn missing_imports_are_named() {
        let mut r = Registry::new().unwrap();
        let src = "syntax = \"proto3\";\nimport \"other.proto\";\n";
        let err = r.add_sources([("a.proto", src)]).unwrap_err().to_string();
        assert_eq!(err, "a.proto:2:1: import 'other.proto' not found");
    }

    #[test]
    fn bundled_and_well_known_imports_resolve_and_files_load_incrementally() {
        let mut r = Registry::new().unwrap();
        r.add_sources([("library.proto", include_str!("../../protos/library.proto"))])
            .unwrap();
        assert!(r.message("google.api.HttpRule").is_ok());
        assert!(r.message("google.protobuf.FieldMask").is_ok());
        r.add_sources([("helloworld.proto", HELLO)]).unwrap();
        // Loading the same file again is harmless.
        r.add_sources([("helloworld.proto", HELLO)]).unwrap();
        // A later file may import an earlier one.
        let user = "syntax = \"proto3\";\nimport \"helloworld.proto\";\nmessage W { helloworld.HelloRequest r = 1; }\n";
        r.add_sources([("user.proto", user)]).unwrap();
        assert!(r.message("W").is_ok());
    }

    #[test]
    fn descriptor_sets_round_trip() {
        let mut r = Registry::new().unwrap();
        r.add_sources([("helloworld.proto", HELLO)]).unwrap();
        let bytes = r.encode_descriptor_set();
        let mut other = Registry::new().unwrap();
        other.add_descriptor_set(&bytes).unwrap();
        assert!(other.method("/helloworld.Greeter/SayHello").is_ok());
        assert!(other
            .add_descriptor_set(b"\xff\xff")
            .unwrap_err()
            .to_string()
            .starts_with("invalid file descriptor set: "));
    }

    /// Found by the `descriptors` fuzz target: prost-reflect panicked on
    /// these, which in the module is a trap.
    #[test]
    fn a_descriptor_set_with_an_unknown_syntax_is_an_error() {
        let file = |syntax: &[u8]| {
            let mut file = b"\x0a\x07a.proto\x12\x01a".to_vec();
            file.extend_from_slice(&[0x62, syntax.len() as u8]);
            file.extend_from_slice(syntax);
            let mut set = vec![0x0a, file.len() as u8];
            set.extend_from_slice(&file);
            set
        };
        for (syntax, shown) in [
            (&b"prot\x003"[..], "prot\u{0}3"),
            (b"", ""),
            (b"editions", "editions"),
        ] {
            let mut r = Registry::new().unwrap();
            assert_eq!(
                r.add_descriptor_set(&file(syntax)).unwrap_err().to_string(),
                format!("invalid file descriptor set: a.proto: unknown syntax '{shown}' (expected proto2 or proto3)")
            );
        }
        let mut r = Registry::new().unwrap();
        r.add_descriptor_set(&file(b"proto3")).unwrap();
        assert!(r.pool().get_file_by_name("a.proto").is_some());
    }
}

#[cfg(test)]
mod public_import_tests {
    use super::*;

    fn set(files: Vec<prost_types::FileDescriptorProto>) -> Vec<u8> {
        prost_types::FileDescriptorSet { file: files }.encode_to_vec()
    }

    /// f0 .. f{n-1}, each importing every earlier file publicly.
    fn chain(n: usize) -> Vec<prost_types::FileDescriptorProto> {
        (0..n)
            .map(|i| prost_types::FileDescriptorProto {
                name: Some(format!("f{i}.proto")),
                package: Some(format!("p{i}")),
                dependency: (0..i).map(|j| format!("f{j}.proto")).collect(),
                public_dependency: (0..i as i32).collect(),
                syntax: Some("proto3".into()),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn public_imports_that_prost_reflect_would_follow_forever_are_refused_at_once() {
        let started = std::time::Instant::now();
        let err = Registry::new()
            .unwrap()
            .add_descriptor_set(&set(chain(40)))
            .unwrap_err();
        assert!(
            err.to_string()
                .ends_with("its public imports take more than 100000 steps to follow"),
            "{err}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        // A short chain is a set like any other.
        Registry::new()
            .unwrap()
            .add_descriptor_set(&set(chain(5)))
            .unwrap();
    }
}
