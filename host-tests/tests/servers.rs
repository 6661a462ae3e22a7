//! The services started in-process on 127.0.0.1:0 and called with the
//! generated tonic clients, plus one check of a real binary.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use host_tests::pb::google::rpc::{BadRequest, ErrorInfo, Status as RpcStatus};
use host_tests::pb::grpc::examples::echo::echo_client::EchoClient;
use host_tests::pb::grpc::examples::echo::EchoRequest;
use host_tests::pb::grpcwasm::testing::testing_client::TestingClient;
use host_tests::pb::grpcwasm::testing::{
    Empty, FailRequest, LargeReply, LargeRequest, SleepRequest, StreamRequest,
};
use host_tests::pb::helloworld::greeter_client::GreeterClient;
use host_tests::pb::helloworld::HelloRequest;
use host_tests::pb::routeguide::route_guide_client::RouteGuideClient;
use host_tests::pb::routeguide::{Point, Rectangle, RouteNote};
use host_tests::{certs, echo, greeter, route_guide, serve, testing};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, Server};
use tonic::Code;

/// A server running in this process; dropping it stops the server.
struct Running {
    addr: std::net::SocketAddr,
    _stop: oneshot::Sender<()>,
}

async fn start(router: tonic::transport::server::Router) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(serve::serve_on(router, listener, async {
        let _ = stopped.await;
    }));
    Running { addr, _stop: stop }
}

async fn channel(running: &Running) -> Channel {
    Channel::from_shared(format!("http://{}", running.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

async fn testing_client() -> (Running, TestingClient<Channel>) {
    let running = start(Server::builder().add_service(testing::service())).await;
    let client = TestingClient::new(channel(&running).await)
        .max_decoding_message_size(testing::MAX_MESSAGE)
        .max_encoding_message_size(testing::MAX_MESSAGE);
    (running, client)
}

#[tokio::test]
async fn say_hello() {
    let running = start(Server::builder().add_service(greeter::service())).await;
    let mut client = GreeterClient::new(channel(&running).await);
    let reply = client
        .say_hello(HelloRequest {
            name: "foobar".into(),
        })
        .await
        .expect("SayHello");
    assert_eq!(reply.into_inner().message, "Hello foobar!");
}

#[tokio::test]
async fn fail_with_details() {
    let (_running, mut client) = testing_client().await;
    let status = client
        .fail(FailRequest {
            code: 5,
            message: "no such thing".into(),
            with_details: true,
        })
        .await
        .expect_err("Fail must fail");
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(status.message(), "no such thing");

    let details = RpcStatus::decode(status.details()).expect("google.rpc.Status");
    assert_eq!(details.code, 5);
    assert_eq!(details.message, "no such thing");
    assert_eq!(details.details.len(), 2);
    assert_eq!(
        details.details[0].type_url,
        "type.googleapis.com/google.rpc.ErrorInfo"
    );
    assert_eq!(
        details.details[1].type_url,
        "type.googleapis.com/google.rpc.BadRequest"
    );

    let info = ErrorInfo::decode(details.details[0].value.as_slice()).expect("ErrorInfo");
    assert_eq!(info.reason, "TEST_FAILURE");
    assert_eq!(info.domain, "grpc-wasm.test");
    assert_eq!(
        info.metadata.get("requested_code").map(String::as_str),
        Some("5")
    );
    let bad = BadRequest::decode(details.details[1].value.as_slice()).expect("BadRequest");
    assert_eq!(bad.field_violations.len(), 1);
    assert_eq!(bad.field_violations[0].field, "code");
    assert_eq!(bad.field_violations[0].description, "requested failure");
}

#[tokio::test]
async fn fail_without_details_and_bad_codes() {
    let (_running, mut client) = testing_client().await;
    let status = client
        .fail(FailRequest {
            code: 14,
            message: "down".into(),
            with_details: false,
        })
        .await
        .expect_err("Fail must fail");
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unavailable, "down")
    );
    assert!(status.details().is_empty());

    for code in [0, 17, -1] {
        let status = client
            .fail(FailRequest {
                code,
                message: String::new(),
                with_details: true,
            })
            .await
            .expect_err("Fail must fail");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "code must be 1..16");
    }
}

#[tokio::test]
async fn echo_metadata_headers_and_trailers() {
    let (_running, mut client) = testing_client().await;
    let mut request = tonic::Request::new(Empty {});
    let md = request.metadata_mut();
    md.insert("x-echo-color", "blue".parse().expect("value"));
    md.insert("plain", "kept".parse().expect("value"));
    md.insert_bin(
        "x-echo-raw-bin",
        tonic::metadata::MetadataValue::from_bytes(&[0, 255, 7]),
    );
    let response = client.echo_metadata(request).await.expect("EchoMetadata");

    // Tonic merges trailers into the metadata of a unary response.
    let got = response.metadata();
    assert_eq!(got.get("x-echo-color").expect("header"), "blue");
    assert_eq!(got.get("x-echo-color-trailer").expect("trailer"), "blue");
    assert!(got.get("plain").is_none());
    let raw = got.get_bin("x-echo-raw-trailer-bin").expect("bin trailer");
    assert_eq!(raw.to_bytes().expect("base64").as_ref(), &[0, 255, 7]);

    let body = &response.get_ref().metadata;
    assert_eq!(body.get("x-echo-color").map(String::as_str), Some("blue"));
    assert_eq!(body.get("plain").map(String::as_str), Some("kept"));
    assert!(
        !body.contains_key("x-echo-raw-bin"),
        "binary entries stay out of the body"
    );
}

#[tokio::test]
async fn stream_then_fail() {
    let (_running, mut client) = testing_client().await;
    let request = StreamRequest {
        count: 3,
        code: 9,
        message: "stop".into(),
        interval_millis: 5,
    };
    let mut stream = client
        .stream_then_fail(request)
        .await
        .expect("call")
        .into_inner();
    let mut indexes = Vec::new();
    let end = loop {
        match stream.message().await {
            Ok(Some(item)) => indexes.push(item.index),
            Ok(None) => break None,
            Err(status) => break Some(status),
        }
    };
    assert_eq!(indexes, [0, 1, 2]);
    let end = end.expect("ends with a status");
    assert_eq!(
        (end.code(), end.message()),
        (Code::FailedPrecondition, "stop")
    );

    let request = StreamRequest {
        count: 2,
        code: 0,
        message: String::new(),
        interval_millis: 0,
    };
    let mut stream = client
        .stream_then_fail(request)
        .await
        .expect("call")
        .into_inner();
    let mut count = 0;
    while stream.message().await.expect("OK stream").is_some() {
        count += 1;
    }
    assert_eq!(count, 2);
}

#[tokio::test]
async fn large_and_echo_bytes_at_the_limit() {
    let (_running, mut client) = testing_client().await;
    let size = testing::MAX_PAYLOAD as i32;
    let reply = client
        .large(LargeRequest { size })
        .await
        .expect("Large")
        .into_inner();
    assert_eq!(reply.payload.len(), testing::MAX_PAYLOAD);
    assert_eq!(reply.payload, testing::pattern(testing::MAX_PAYLOAD));

    let echoed = client
        .echo_bytes(LargeReply {
            payload: reply.payload,
        })
        .await
        .expect("EchoBytes")
        .into_inner();
    assert_eq!(echoed.payload.len(), testing::MAX_PAYLOAD);

    let status = client
        .large(LargeRequest { size: size + 1 })
        .await
        .expect_err("too large");
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn sleep_and_deadline() {
    let (_running, mut client) = testing_client().await;
    let reply = client
        .sleep(SleepRequest { millis: 20 })
        .await
        .expect("Sleep")
        .into_inner();
    assert!(reply.slept_millis >= 20, "{}", reply.slept_millis);

    let mut request = tonic::Request::new(SleepRequest { millis: 2000 });
    request.set_timeout(Duration::from_millis(50));
    let status = client.sleep(request).await.expect_err("deadline");
    assert_eq!(status.code(), Code::DeadlineExceeded);
}

#[tokio::test]
async fn route_guide_methods() {
    let db = route_guide::load_db(&route_guide::default_db_path()).expect("db");
    let named = db
        .iter()
        .find(|f| !f.name.is_empty())
        .expect("a named feature")
        .clone();
    let running = start(Server::builder().add_service(route_guide::service(db.clone()))).await;
    let mut client = RouteGuideClient::new(channel(&running).await);

    let at = named.location.expect("location");
    let got = client
        .get_feature(at)
        .await
        .expect("GetFeature")
        .into_inner();
    assert_eq!(got, named);
    let nowhere = Point {
        latitude: 1,
        longitude: 1,
    };
    let got = client
        .get_feature(nowhere)
        .await
        .expect("GetFeature")
        .into_inner();
    assert_eq!((got.name.as_str(), got.location), ("", Some(nowhere)));

    // The whole database area, corners swapped: every named feature comes back.
    let all = Rectangle {
        lo: Some(Point {
            latitude: 420_000_000,
            longitude: -730_000_000,
        }),
        hi: Some(Point {
            latitude: 400_000_000,
            longitude: -750_000_000,
        }),
    };
    let mut stream = client
        .list_features(all)
        .await
        .expect("ListFeatures")
        .into_inner();
    let mut listed = 0;
    while let Some(feature) = stream.message().await.expect("stream") {
        assert!(!feature.name.is_empty());
        listed += 1;
    }
    assert_eq!(listed, db.iter().filter(|f| !f.name.is_empty()).count());

    let route = vec![at, nowhere, at];
    let summary = client
        .record_route(tokio_stream::iter(route))
        .await
        .expect("RecordRoute")
        .into_inner();
    assert_eq!((summary.point_count, summary.feature_count), (3, 2));
    let leg = route_guide::distance_m(&at, &nowhere);
    assert_eq!(summary.distance, (2.0 * leg).round() as i32);

    let here = Point {
        latitude: 5,
        longitude: 6,
    };
    let note = |m: &str| RouteNote {
        location: Some(here),
        message: m.into(),
    };
    let notes = vec![note("a"), note("b"), note("c")];
    let mut replies = client
        .route_chat(tokio_stream::iter(notes))
        .await
        .expect("RouteChat")
        .into_inner();
    let mut seen = Vec::new();
    while let Some(reply) = replies.message().await.expect("stream") {
        seen.push(reply.message);
    }
    // "a" comes back for "b", then "a" and "b" for "c".
    assert_eq!(seen, ["a", "a", "b"]);
}

/// A test's own directory in the temp dir, removed when the test ends,
/// whether it passed or failed.
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("host-tests-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    TempDir(dir)
}

#[tokio::test]
async fn echo_over_mtls_with_generated_certs() {
    let dir = temp_dir("mtls");
    assert_eq!(certs::ensure(&dir).expect("certs"), certs::Outcome::Written);
    assert_eq!(
        certs::ensure(&dir).expect("certs"),
        certs::Outcome::AlreadyPresent
    );
    let read = |name: &str| std::fs::read(dir.join(name)).expect("cert file");

    let tls = echo::tls_config(&dir, true).expect("tls config");
    let mut server = Server::builder().tls_config(tls).expect("tls");
    let running = start(server.add_service(echo::service())).await;
    let uri = format!("https://{}", running.addr);
    let client_tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("ca.pem")))
        .domain_name("example.com");

    let with_cert = client_tls
        .clone()
        .identity(Identity::from_pem(read("client1.pem"), read("client1.key")));
    let channel = Channel::from_shared(uri.clone())
        .expect("uri")
        .tls_config(with_cert)
        .expect("client tls")
        .connect()
        .await
        .expect("mTLS connect");
    let mut client = EchoClient::new(channel);
    let reply = client
        .unary_echo(EchoRequest {
            message: "over mtls".into(),
        })
        .await
        .expect("UnaryEcho");
    assert_eq!(reply.into_inner().message, "over mtls");

    let requests = ["x", "y", "z"].map(|m| EchoRequest { message: m.into() });
    let joined = client
        .client_streaming_echo(tokio_stream::iter(requests))
        .await
        .expect("ClientStreamingEcho");
    assert_eq!(joined.into_inner().message, "x,y,z");

    let mut stream = client
        .server_streaming_echo(EchoRequest {
            message: "hi".into(),
        })
        .await
        .expect("ServerStreamingEcho")
        .into_inner();
    let mut got = Vec::new();
    while let Some(reply) = stream.message().await.expect("stream") {
        got.push(reply.message);
    }
    assert_eq!(got, ["hi 0", "hi 1", "hi 2"]);

    // Without a client certificate the handshake (or the first call) fails.
    let no_cert = Channel::from_shared(uri)
        .expect("uri")
        .tls_config(client_tls)
        .expect("client tls")
        .connect()
        .await;
    if let Ok(channel) = no_cert {
        let result = EchoClient::new(channel)
            .unary_echo(EchoRequest {
                message: "x".into(),
            })
            .await;
        assert!(
            result.is_err(),
            "a call without a client certificate succeeded"
        );
    }
}

#[test]
fn binary_announces_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_greeter-server"))
        .args(["--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn greeter-server");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read line");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect("announce line");
    let addr: std::net::SocketAddr = addr.parse().expect("socket address");
    assert_ne!(
        addr.port(),
        0,
        "the bound port is printed, not the requested one"
    );

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    for _ in 0..100 {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(status.success(), "{status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("greeter-server did not exit within 5 s of SIGTERM");
}
