//! A reflection client without I/O: it says which requests to send on the
//! `ServerReflectionInfo` stream, reads the answers in the order the server
//! gives them (one per request, as every server answers a stream in
//! order), asks for each import it has not got, and ends with a closed
//! `FileDescriptorSet` in dependency order. Hosts carry the bytes: the
//! filter through `proxy_grpc_stream`, the others through their own
//! transports.

use std::collections::VecDeque;
use std::fmt;

use rustc_hash::{FxHashMap, FxHashSet};

use prost::Message;

use super::messages::{Answer, Ask, Request, Response};
use crate::code::Code;
use crate::descriptors::FileImports;
use crate::limits::{MAX_REFLECTED_BYTES, MAX_REFLECTED_FILES, MAX_REFLECTION_ANSWER_BYTES};

/// The method every version serves.
pub const METHOD: &str = "ServerReflectionInfo";

/// Which reflection service a server speaks: `v1` is asked first, and
/// `v1alpha` (older servers) when `v1` is UNIMPLEMENTED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V1Alpha,
}

impl Version {
    pub fn service(self) -> &'static str {
        match self {
            Version::V1 => "grpc.reflection.v1.ServerReflection",
            Version::V1Alpha => "grpc.reflection.v1alpha.ServerReflection",
        }
    }
}

/// Why a load failed; each names what was asked when it can.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReflectionError {
    /// What the server said with its last UNIMPLEMENTED, if anything.
    #[error("the server has no reflection service (grpc.reflection.v1 and v1alpha are UNIMPLEMENTED){}", said(.0))]
    NoReflection(String),
    #[error("the server answered {code} for {asked}: {message}")]
    Refused {
        asked: String,
        code: &'static str,
        message: String,
    },
    #[error("the reflection stream ended ({code}: {message}) before {asked} was answered")]
    Closed {
        asked: String,
        code: &'static str,
        message: String,
    },
    #[error("a malformed reflection answer to {asked}: {why}")]
    Malformed { asked: String, why: String },
    #[error("the server's answer to {asked} is over the limit of {limit} {what}")]
    TooLarge {
        asked: String,
        what: &'static str,
        limit: usize,
    },
    #[error("the server sent two different files named '{0}'")]
    Conflict(String),
    #[error("the server's files import each other in a cycle: {0}")]
    Cycle(String),
    #[error("the server lists no services but its reflection service")]
    NoServices,
}

impl ReflectionError {
    /// The gRPC code a caller gets for it: the server's own where it
    /// answered one, INTERNAL for an answer this client cannot use.
    pub fn code(&self) -> Code {
        match self {
            ReflectionError::NoReflection(_) => Code::Unimplemented,
            // A server that ends the load "OK" unanswered, or answers an
            // error with code 0, has not succeeded: never OK.
            ReflectionError::Refused { code, .. } | ReflectionError::Closed { code, .. } => {
                Code::from_name(code)
                    .filter(|c| *c != Code::Ok)
                    .unwrap_or(Code::Unknown)
            }
            ReflectionError::TooLarge { .. } => Code::ResourceExhausted,
            ReflectionError::NoServices => Code::NotFound,
            ReflectionError::Malformed { .. }
            | ReflectionError::Conflict(_)
            | ReflectionError::Cycle(_) => Code::Internal,
        }
    }
}

/// A closed set of files, ready for a `Registry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reflected {
    /// The version the server answered, to ask first next time.
    pub version: Version,
    /// The services asked for, or every service the server listed but
    /// its reflection service.
    pub services: Vec<String>,
    /// An encoded `FileDescriptorSet`, each file after its imports.
    pub descriptor_set: Vec<u8>,
    pub files: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Asked {
    Services,
    Service(String),
    File { name: String, importer: String },
}

impl fmt::Display for Asked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Asked::Services => write!(f, "the list of services"),
            Asked::Service(name) => write!(f, "service '{name}'"),
            Asked::File { name, importer } => {
                write!(f, "file '{name}' (imported by '{importer}')")
            }
        }
    }
}

impl Asked {
    fn request(&self) -> Request {
        let ask = match self {
            Asked::Services => Ask::ListServices(String::new()),
            Asked::Service(name) => Ask::FileContainingSymbol(name.clone()),
            Asked::File { name, .. } => Ask::FileByFilename(name.clone()),
        };
        Request {
            host: String::new(),
            ask: Some(ask),
        }
    }
}

struct File {
    name: String,
    bytes: Vec<u8>,
    imports: Vec<String>,
}

/// One load: from the first request to a closed set, or an error. Every
/// count a server controls is bounded: files held and asked for, imports
/// per file, services listed, bytes held, and bytes of all its answers
/// (servers resend a file's imports with each answer).
pub struct Loader {
    version: Version,
    /// Whether the other version was tried after this one was
    /// UNIMPLEMENTED.
    switched: bool,
    wanted: Option<Vec<String>>,
    services: Vec<String>,
    /// In the order they came; `names` finds them.
    files: Vec<File>,
    names: FxHashMap<String, usize>,
    bytes: usize,
    received: usize,
    /// Files the caller has already (the well-known types it bundles):
    /// never asked for, and skipped when the server sends them.
    known: FxHashSet<String>,
    asked_files: FxHashSet<String>,
    to_send: VecDeque<Asked>,
    /// Sent and not yet answered, in the order the answers will come.
    waiting: VecDeque<Asked>,
    answered: bool,
}

/// Services whose files a transcoder has no use for, and which every
/// server that answers reflection lists.
const REFLECTION_PACKAGE: &str = "grpc.reflection.";

impl Loader {
    /// A load of `services` (`None`: every service the server lists),
    /// asked of `version` first. `known`: files the caller has.
    pub fn new(
        version: Version,
        services: Option<&[String]>,
        known: impl IntoIterator<Item = String>,
    ) -> Loader {
        let mut loader = Loader {
            version,
            switched: false,
            wanted: services.map(<[String]>::to_vec),
            services: Vec::new(),
            files: Vec::new(),
            names: FxHashMap::default(),
            bytes: 0,
            received: 0,
            known: known.into_iter().collect(),
            asked_files: FxHashSet::default(),
            to_send: VecDeque::new(),
            waiting: VecDeque::new(),
            answered: false,
        };
        loader.begin();
        loader
    }

    fn begin(&mut self) {
        match &self.wanted {
            Some(services) => {
                self.services = services.clone();
                self.to_send = services.iter().cloned().map(Asked::Service).collect();
            }
            None => self.to_send = VecDeque::from([Asked::Services]),
        }
    }

    /// The service to open the stream on (`METHOD` is the method).
    pub fn version(&self) -> Version {
        self.version
    }

    /// What the load waits for now, for a message that says why it ended.
    pub fn waiting_for(&self) -> String {
        self.waiting
            .front()
            .map_or_else(|| "nothing".into(), ToString::to_string)
    }

    /// The requests to send now, encoded; each answer may queue more.
    pub fn requests(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(asked) = self.to_send.pop_front() {
            // A file that came with another answer needs no request.
            if let Asked::File { name, .. } = &asked {
                if self.names.contains_key(name) {
                    continue;
                }
            }
            out.push(asked.request().encode_to_vec());
            self.waiting.push_back(asked);
        }
        out
    }

    /// Whether every request sent has been answered.
    pub fn is_answered(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Whether every answer has come and nothing is left to ask.
    pub fn is_complete(&self) -> bool {
        let came = |asked: &Asked| matches!(asked, Asked::File { name, .. } if self.names.contains_key(name));
        self.answered && self.waiting.is_empty() && self.to_send.iter().all(came)
    }

    /// Reads one answer (a `ServerReflectionResponse`).
    pub fn on_message(&mut self, bytes: &[u8]) -> Result<(), ReflectionError> {
        let asked = self
            .waiting
            .pop_front()
            .ok_or_else(|| ReflectionError::Malformed {
                asked: "nothing".into(),
                why: "an answer came with no request waiting".into(),
            })?;
        self.answered = true;
        self.received = self.received.saturating_add(bytes.len());
        if self.received > MAX_REFLECTION_ANSWER_BYTES {
            return Err(too_large(
                &asked,
                "bytes of answers",
                MAX_REFLECTION_ANSWER_BYTES,
            ));
        }
        let malformed = |why: String| ReflectionError::Malformed {
            asked: asked.to_string(),
            why,
        };
        let response = Response::decode(bytes).map_err(|e| malformed(e.to_string()))?;
        match (&asked, response.answer) {
            (_, Some(Answer::Error(e))) => Err(ReflectionError::Refused {
                asked: asked.to_string(),
                code: Code::from_i32(e.error_code).name(),
                message: e.error_message,
            }),
            (Asked::Services, Some(Answer::Services(list))) => self.listed(&asked, list.service),
            (Asked::Service(_) | Asked::File { .. }, Some(Answer::Files(files))) => {
                let mut names = Vec::with_capacity(files.file_descriptor_proto.len());
                for file in files.file_descriptor_proto {
                    names.push(self.add_file(&asked, file)?);
                }
                match &asked {
                    Asked::File { name, .. } if !names.contains(name) => Err(malformed(format!(
                        "the answer holds {names:?}, not the file asked for"
                    ))),
                    _ if names.is_empty() => Err(malformed("the answer holds no file".into())),
                    _ => Ok(()),
                }
            }
            (_, other) => Err(malformed(format!(
                "expected {}, got {}",
                match asked {
                    Asked::Services => "a list of services",
                    _ => "files",
                },
                match other {
                    None => "no answer",
                    Some(Answer::Files(_)) => "files",
                    Some(Answer::Services(_)) => "a list of services",
                    Some(Answer::Error(_)) => "an error",
                }
            ))),
        }
    }

    /// The services a server listed, each once, but its reflection service.
    fn listed(
        &mut self,
        asked: &Asked,
        list: Vec<super::messages::ServiceResponse>,
    ) -> Result<(), ReflectionError> {
        let mut seen = FxHashSet::default();
        for service in list {
            if service.name.starts_with(REFLECTION_PACKAGE) || !seen.insert(service.name.clone()) {
                continue;
            }
            if self.services.len() == MAX_REFLECTED_FILES {
                return Err(too_large(asked, "services", MAX_REFLECTED_FILES));
            }
            self.services.push(service.name);
        }
        if self.services.is_empty() {
            return Err(ReflectionError::NoServices);
        }
        let services = self.services.clone();
        self.to_send
            .extend(services.into_iter().map(Asked::Service));
        Ok(())
    }

    /// One file of an answer; its name.
    fn add_file(&mut self, asked: &Asked, bytes: Vec<u8>) -> Result<String, ReflectionError> {
        let malformed = |why: String| ReflectionError::Malformed {
            asked: asked.to_string(),
            why,
        };
        let head = FileImports::decode(bytes.as_slice())
            .map_err(|e| malformed(format!("a file descriptor: {e}")))?;
        if head.name.is_empty() {
            return Err(malformed("a file descriptor without a name".into()));
        }
        if let Some(&at) = self.names.get(&head.name) {
            return if self.files[at].bytes == bytes {
                Ok(head.name)
            } else {
                Err(ReflectionError::Conflict(head.name))
            };
        }
        if self.known.contains(&head.name) {
            return Ok(head.name);
        }
        if self.files.len() == MAX_REFLECTED_FILES || head.dependency.len() > MAX_REFLECTED_FILES {
            return Err(too_large(asked, "files", MAX_REFLECTED_FILES));
        }
        self.bytes = self.bytes.saturating_add(bytes.len());
        if self.bytes > MAX_REFLECTED_BYTES {
            return Err(too_large(asked, "bytes of files", MAX_REFLECTED_BYTES));
        }
        let mut imports = FxHashSet::default();
        for import in &head.dependency {
            // protoc refuses a file that imports another twice.
            if !imports.insert(import.as_str()) {
                return Err(malformed(format!(
                    "'{}' imports '{import}' twice",
                    head.name
                )));
            }
            let have = self.names.contains_key(import) || self.known.contains(import);
            if !have && self.asked_files.insert(import.clone()) {
                if self.asked_files.len() > MAX_REFLECTED_FILES {
                    return Err(too_large(asked, "files", MAX_REFLECTED_FILES));
                }
                self.to_send.push_back(Asked::File {
                    name: import.clone(),
                    importer: head.name.clone(),
                });
            }
        }
        let name = head.name.clone();
        self.names.insert(head.name.clone(), self.files.len());
        self.files.push(File {
            name: head.name,
            bytes,
            imports: head.dependency,
        });
        Ok(name)
    }

    /// Reads one answer and says what follows: `Some(requests)` to send
    /// (none, while answers are still due), or `None` once the load is
    /// complete and the stream has done its work.
    pub fn on_answer(&mut self, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>, ReflectionError> {
        self.on_message(bytes)?;
        Ok((!self.is_complete()).then(|| self.requests()))
    }

    /// The stream ended with `code`. `Ok(Some(version))`: ask again from
    /// the start on that version (the server lacks this one); `Ok(None)`:
    /// the load is complete, [`Loader::finish`] it.
    pub fn on_close(
        &mut self,
        code: Code,
        message: &str,
    ) -> Result<Option<Version>, ReflectionError> {
        if self.is_complete() {
            return Ok(None);
        }
        if code == Code::Unimplemented && !self.answered {
            // Each version once, the remembered one first: a server may
            // drop either.
            if std::mem::replace(&mut self.switched, true) {
                return Err(ReflectionError::NoReflection(message.to_string()));
            }
            self.version = match self.version {
                Version::V1 => Version::V1Alpha,
                Version::V1Alpha => Version::V1,
            };
            self.waiting.clear();
            self.begin();
            return Ok(Some(self.version));
        }
        let asked = self
            .waiting
            .front()
            .or(self.to_send.front())
            .map(ToString::to_string)
            .unwrap_or_else(|| "the list of services".into());
        Err(ReflectionError::Closed {
            asked,
            code: code.name(),
            message: message.to_string(),
        })
    }

    /// The closed set, each file after the files it imports.
    pub fn finish(self) -> Result<Reflected, ReflectionError> {
        let mut order = Vec::with_capacity(self.files.len());
        let mut marks = vec![None; self.files.len()];
        for at in 0..self.files.len() {
            visit(
                at,
                &self.files,
                &self.names,
                &mut marks,
                &mut order,
                &mut Vec::new(),
            )?;
        }
        let mut set = Vec::with_capacity(self.bytes + 8 * order.len());
        for &at in &order {
            crate::descriptors::push_file(&mut set, &self.files[at].bytes);
        }
        Ok(Reflected {
            version: self.version,
            services: self.services,
            descriptor_set: set,
            files: order.len(),
        })
    }
}

/// `: message`, or nothing for a server that said nothing.
fn said(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

fn too_large(asked: &Asked, what: &'static str, limit: usize) -> ReflectionError {
    ReflectionError::TooLarge {
        asked: asked.to_string(),
        what,
        limit,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    Visiting,
    Done,
}

/// Depth-first, imports first; a file met again while its own imports are
/// being visited closes a cycle. Depth is bounded by the file count.
fn visit(
    at: usize,
    files: &[File],
    names: &FxHashMap<String, usize>,
    marks: &mut [Option<Mark>],
    order: &mut Vec<usize>,
    path: &mut Vec<usize>,
) -> Result<(), ReflectionError> {
    match marks[at] {
        Some(Mark::Done) => return Ok(()),
        Some(Mark::Visiting) => {
            let start = path.iter().position(|p| *p == at).unwrap_or(0);
            let mut cycle: Vec<&str> = path[start..]
                .iter()
                .map(|&p| files[p].name.as_str())
                .collect();
            cycle.push(&files[at].name);
            return Err(ReflectionError::Cycle(cycle.join(" -> ")));
        }
        None => {}
    }
    marks[at] = Some(Mark::Visiting);
    path.push(at);
    for import in &files[at].imports {
        // A file the caller has is not in the set.
        if let Some(&next) = names.get(import) {
            visit(next, files, names, marks, order, path)?;
        }
    }
    path.pop();
    marks[at] = Some(Mark::Done);
    order.push(at);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::messages::*;
    use super::*;

    fn file(name: &str, imports: &[&str]) -> Vec<u8> {
        prost_types::FileDescriptorProto {
            name: Some(name.into()),
            dependency: imports.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn files(list: Vec<Vec<u8>>) -> Vec<u8> {
        Response {
            answer: Some(Answer::Files(FileDescriptorResponse {
                file_descriptor_proto: list,
            })),
        }
        .encode_to_vec()
    }

    fn services(names: &[&str]) -> Vec<u8> {
        Response {
            answer: Some(Answer::Services(ListServiceResponse {
                service: names
                    .iter()
                    .map(|n| ServiceResponse {
                        name: n.to_string(),
                    })
                    .collect(),
            })),
        }
        .encode_to_vec()
    }

    fn asks(requests: Vec<Vec<u8>>) -> Vec<Ask> {
        requests
            .iter()
            .map(|r| Request::decode(r.as_slice()).unwrap().ask.unwrap())
            .collect()
    }

    fn names_in(set: &[u8]) -> Vec<String> {
        prost_types::FileDescriptorSet::decode(set)
            .unwrap()
            .file
            .into_iter()
            .map(|f| f.name.unwrap())
            .collect()
    }

    #[test]
    fn lists_services_then_asks_each_and_every_missing_import() {
        let mut loader = Loader::new(
            Version::V1,
            None,
            ["google/protobuf/empty.proto".to_string()],
        );
        assert_eq!(asks(loader.requests()), [Ask::ListServices(String::new())]);
        loader.on_message(&services(&["a.A", "b.B"])).unwrap();
        assert_eq!(
            asks(loader.requests()),
            [
                Ask::FileContainingSymbol("a.A".into()),
                Ask::FileContainingSymbol("b.B".into())
            ]
        );
        // a.proto comes with one import; b.proto's import is asked for.
        loader
            .on_message(&files(vec![
                file("a.proto", &["common.proto", "google/protobuf/empty.proto"]),
                file("common.proto", &[]),
            ]))
            .unwrap();
        loader
            .on_message(&files(vec![file("b.proto", &["more.proto"])]))
            .unwrap();
        assert!(!loader.is_complete());
        assert_eq!(
            asks(loader.requests()),
            [Ask::FileByFilename("more.proto".into())]
        );
        loader
            .on_message(&files(vec![file("more.proto", &["common.proto"])]))
            .unwrap();
        assert!(loader.is_complete());
        assert_eq!(loader.on_close(Code::Ok, ""), Ok(None));
        let done = loader.finish().unwrap();
        assert_eq!(done.services, ["a.A", "b.B"]);
        assert_eq!(done.files, 4);
        let order = names_in(&done.descriptor_set);
        let at = |n: &str| order.iter().position(|o| o == n).unwrap();
        assert!(at("common.proto") < at("a.proto"));
        assert!(at("common.proto") < at("more.proto") && at("more.proto") < at("b.proto"));
    }

    #[test]
    fn named_services_are_asked_directly() {
        let wanted = ["x.X".to_string()];
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        assert_eq!(
            asks(loader.requests()),
            [Ask::FileContainingSymbol("x.X".into())]
        );
    }

    #[test]
    fn v1_unimplemented_retries_on_v1alpha_then_gives_up() {
        let mut loader = Loader::new(Version::V1, None, []);
        loader.requests();
        assert_eq!(
            loader.on_close(Code::Unimplemented, "unknown service"),
            Ok(Some(Version::V1Alpha))
        );
        assert_eq!(
            loader.version().service(),
            "grpc.reflection.v1alpha.ServerReflection"
        );
        assert_eq!(asks(loader.requests()), [Ask::ListServices(String::new())]);
        assert_eq!(
            loader.on_close(Code::Unimplemented, "unknown service").unwrap_err().to_string(),
            "the server has no reflection service (grpc.reflection.v1 and v1alpha are UNIMPLEMENTED): unknown service"
        );
    }

    #[test]
    fn an_error_answer_names_what_was_asked() {
        let wanted = ["x.X".to_string()];
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        let refused = Response {
            answer: Some(Answer::Error(ErrorResponse {
                error_code: 5,
                error_message: "symbol not found".into(),
            })),
        };
        assert_eq!(
            loader
                .on_message(&refused.encode_to_vec())
                .unwrap_err()
                .to_string(),
            "the server answered NOT_FOUND for service 'x.X': symbol not found"
        );
    }

    #[test]
    fn a_cycle_of_imports_is_refused_with_its_files() {
        let wanted = ["x.X".to_string()];
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        loader
            .on_message(&files(vec![
                file("a.proto", &["b.proto"]),
                file("b.proto", &["a.proto"]),
            ]))
            .unwrap();
        assert!(loader.is_complete());
        assert_eq!(
            loader.finish().unwrap_err().to_string(),
            "the server's files import each other in a cycle: a.proto -> b.proto -> a.proto"
        );
    }

    #[test]
    fn a_file_sent_twice_must_be_the_same() {
        let wanted = ["x.X".to_string(), "y.Y".to_string()];
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        loader
            .on_message(&files(vec![file("a.proto", &[])]))
            .unwrap();
        assert_eq!(
            loader.on_message(&files(vec![file("a.proto", &["z.proto"])])),
            Err(ReflectionError::Conflict("a.proto".into()))
        );
    }

    #[test]
    fn the_set_is_bounded_in_files_and_bytes() {
        let wanted = ["x.X".to_string()];
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        let many: Vec<Vec<u8>> = (0..=MAX_REFLECTED_FILES)
            .map(|i| file(&format!("f{i}.proto"), &[]))
            .collect();
        assert_eq!(
            loader.on_message(&files(many)).unwrap_err().to_string(),
            "the server's answer to service 'x.X' is over the limit of 1024 files"
        );
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        let mut huge = prost_types::FileDescriptorProto {
            name: Some("huge.proto".into()),
            ..Default::default()
        };
        huge.package = Some("p".repeat(MAX_REFLECTED_BYTES));
        assert_eq!(
            loader
                .on_message(&files(vec![huge.encode_to_vec()]))
                .unwrap_err()
                .to_string(),
            "the server's answer to service 'x.X' is over the limit of 16777216 bytes of files"
        );
    }

    #[test]
    fn imports_asked_for_are_bounded_and_each_once() {
        let wanted = ["x.X".to_string()];
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        let names: Vec<String> = (0..=MAX_REFLECTED_FILES)
            .map(|i| format!("i{i}.proto"))
            .collect();
        let imports: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(
            loader
                .on_message(&files(vec![file("a.proto", &imports)]))
                .unwrap_err()
                .to_string(),
            "the server's answer to service 'x.X' is over the limit of 1024 files"
        );
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        assert_eq!(
            loader
                .on_message(&files(vec![file("a.proto", &["b.proto", "b.proto"])]))
                .unwrap_err()
                .to_string(),
            "a malformed reflection answer to service 'x.X': 'a.proto' imports 'b.proto' twice"
        );
        // Imports spread over many files count together.
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        let spread: Vec<Vec<u8>> = names
            .chunks(100)
            .enumerate()
            .map(|(i, chunk)| {
                let imports: Vec<&str> = chunk.iter().map(String::as_str).collect();
                file(&format!("s{i}.proto"), &imports)
            })
            .collect();
        assert!(matches!(
            loader.on_message(&files(spread)),
            Err(ReflectionError::TooLarge { what: "files", .. })
        ));
    }

    #[test]
    fn the_answers_together_are_bounded() {
        let wanted: Vec<String> = (0..5).map(|i| format!("x.X{i}")).collect();
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        // The same large file with every answer: held once, read each time.
        let mut big = prost_types::FileDescriptorProto {
            name: Some("big.proto".into()),
            ..Default::default()
        };
        big.package = Some("p".repeat(MAX_REFLECTED_BYTES - 100));
        let answer = files(vec![big.encode_to_vec()]);
        for _ in 0..4 {
            loader.on_message(&answer).unwrap();
        }
        assert_eq!(
            loader.on_message(&answer).unwrap_err().to_string(),
            "the server's answer to service 'x.X4' is over the limit of 67108864 bytes of answers"
        );
    }

    #[test]
    fn the_listed_services_are_each_once_without_reflection_and_bounded() {
        let mut loader = Loader::new(Version::V1, None, []);
        loader.requests();
        loader
            .on_message(&services(&[
                "a.A",
                "grpc.reflection.v1.ServerReflection",
                "a.A",
                "grpc.reflection.v1alpha.ServerReflection",
            ]))
            .unwrap();
        assert_eq!(
            asks(loader.requests()),
            [Ask::FileContainingSymbol("a.A".into())]
        );
        let mut loader = Loader::new(Version::V1, None, []);
        loader.requests();
        assert_eq!(
            loader.on_message(&services(&["grpc.reflection.v1.ServerReflection"])),
            Err(ReflectionError::NoServices)
        );
        let mut loader = Loader::new(Version::V1, None, []);
        loader.requests();
        let many: Vec<String> = (0..=MAX_REFLECTED_FILES)
            .map(|i| format!("s.S{i}"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            loader.on_message(&services(&many)).unwrap_err().to_string(),
            "the server's answer to the list of services is over the limit of 1024 services"
        );
    }

    #[test]
    fn a_remembered_v1alpha_falls_back_to_v1_once() {
        let mut loader = Loader::new(Version::V1Alpha, None, []);
        loader.requests();
        assert_eq!(
            loader.on_close(Code::Unimplemented, ""),
            Ok(Some(Version::V1))
        );
        loader.requests();
        assert!(matches!(
            loader.on_close(Code::Unimplemented, ""),
            Err(ReflectionError::NoReflection(_))
        ));
    }

    #[test]
    fn answers_that_do_not_fit_the_question_are_malformed() {
        let wanted = ["x.X".to_string()];
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        assert_eq!(
            loader.on_message(&services(&["a.A"])).unwrap_err().to_string(),
            "a malformed reflection answer to service 'x.X': expected files, got a list of services"
        );
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        assert!(
            loader.on_message(&files(vec![])).is_err(),
            "nothing was asked yet"
        );
        loader.requests();
        assert_eq!(
            loader
                .on_message(b"\xff")
                .unwrap_err()
                .to_string()
                .split(':')
                .next(),
            Some("a malformed reflection answer to service 'x.X'")
        );
    }

    #[test]
    fn a_stream_that_ends_early_says_what_was_waiting() {
        let wanted = ["x.X".to_string()];
        let mut loader = Loader::new(Version::V1, Some(&wanted), []);
        loader.requests();
        loader
            .on_message(&files(vec![file("a.proto", &["b.proto"])]))
            .unwrap();
        loader.requests();
        assert_eq!(
            loader.on_close(Code::Unavailable, "reset").unwrap_err().to_string(),
            "the reflection stream ended (UNAVAILABLE: reset) before file 'b.proto' (imported by 'a.proto') was answered"
        );
    }
}
