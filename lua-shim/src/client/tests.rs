//! The client against the real module.

use super::calls::check_metadata;
use super::*;
use crate::call::{events, HeaderBlock, Token};
use crate::sync::lock;
use crate::transport::{Gate, Keepalive, TlsOptions};
use std::time::Duration;

/// A client of the real module with helloworld.proto loaded: the
/// module named by `GRPC_WASM_MODULE` (as `make unit` sets it), else
/// `make wasm`'s. No module fails the test: it never passes untested.
pub(crate) fn client() -> Client {
    let wasm = module();
    let cache = crate::host::cache::default_dir();
    let client = Client::new(&wasm, Some(&cache), Arc::new(|_| {})).expect("the module loads");
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protos/helloworld.proto");
    client
        .load_file(&proto, &[])
        .expect("helloworld.proto loads");
    client
}

/// The module named by `GRPC_WASM_MODULE`, else `make wasm`'s.
fn module() -> Vec<u8> {
    let path = std::env::var("GRPC_WASM_MODULE").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../target/grpc_wasm.wasm").to_string()
    });
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("cannot read the module {path} ({e}): run `make wasm`, or set GRPC_WASM_MODULE")
    })
}

/// A call that stays in flight: a stream on a connection no socket feeds.
fn in_flight(client: &Client, conn: ConnId) -> CallId {
    client
        .start(
            conn,
            "/helloworld.Greeter/SayHello",
            None,
            &CallOptions::default(),
        )
        .expect("the call starts")
}

#[test]
fn call_ids_stay_positive_and_never_reuse_a_held_id_across_the_wrap() {
    let client = client();
    let conn = dead_conn(&client);
    let max = i32::MAX as u32;
    lock(&client.inner.host).set_last_id(max - 2);
    let ids: Vec<CallId> = (0..4).map(|_| in_flight(&client, conn)).collect();
    assert_eq!(ids, [max - 1, max, 2, 3].map(CallId));
    // Counting over ids still held skips them.
    lock(&client.inner.host).set_last_id(max - 2);
    assert_eq!(in_flight(&client, conn), CallId(4));
    // A closed call's id is free again.
    client.close(ids[0]);
    lock(&client.inner.host).set_last_id(max - 2);
    assert_eq!(in_flight(&client, conn), CallId(max - 1));
}

/// The call's end: its grpc-status and its status message.
fn end(client: &Client, id: CallId) -> (String, String) {
    match client.next_event(id) {
        Some(Event::End(reply)) => {
            let code = reply
                .headers
                .get("grpc-status")
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
            let message = body["message"].as_str().unwrap_or_default().to_string();
            (code, message)
        }
        other => panic!("expected the end of call {id}, got {other:?}"),
    }
}

const SAY_HELLO: &str = "/helloworld.Greeter/SayHello";
const LOST: &str = "the grpc-wasm module failed (the wasm module trapped: wasm trap: wasm \
                    `unreachable` instruction executed); its instance was rebuilt and this \
                    call was lost";

/// Runs `f` with the module's memory capped at its size: whatever
/// must grow it fails, and the module aborts (a trap), as on any
/// allocation failure.
fn with_memory_capped<T>(client: &Client, f: impl FnOnce() -> T) -> T {
    {
        let mut host = lock(&client.inner.host);
        let size = host.memory_size();
        host.limit_memory(Some(size));
    }
    let result = f();
    lock(&client.inner.host).limit_memory(None);
    result
}

/// A connection whose socket nobody drives: its calls stay in flight.
fn dead_conn(client: &Client) -> ConnId {
    client
        .connect_wire("127.0.0.1:1", &TlsOptions::default(), &Keepalive::default())
        .unwrap()
}

/// Starts a call the module cannot take: its body must grow the
/// capped memory.
fn trapping_call(client: &Client, conn: ConnId) -> CallId {
    let big = format!(r#"{{"name":"{}"}}"#, "x".repeat(2 << 20));
    let options = CallOptions::default();
    with_memory_capped(client, || {
        client.start(conn, SAY_HELLO, Some(big.as_bytes()), &options)
    })
    .unwrap()
}

/// The fresh instance has the protos: the module itself checks this.
fn assert_serving(client: &Client, conn: ConnId) {
    let later = client
        .start(
            conn,
            SAY_HELLO,
            Some(br#"{"name":5}"#),
            &CallOptions::default(),
        )
        .unwrap();
    let refused = "name: expected string, got number";
    assert_eq!(end(client, later), ("3".to_string(), refused.to_string()));
    client.close(later);
}

#[test]
fn calls_on_a_connection_that_is_over_end_unavailable_and_leave_nothing_behind() {
    let client = client();
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protos/route_guide.proto");
    client.load_file(&proto, &[]).unwrap();
    let conn = dead_conn(&client);
    // A server that speaks no HTTP/2 ends the connection.
    client
        .wire_input(conn, b"HTTP/1.1 400 Bad Request\r\n\r\n")
        .unwrap();
    assert!(client.wire_state(conn).unwrap().1, "the connection is over");
    let calls = [
        (SAY_HELLO, Some(&br#"{"name":"a"}"#[..])),
        ("/routeguide.RouteGuide/RouteChat", None),
    ];
    for (path, body) in calls {
        let id = client
            .start(conn, path, body, &CallOptions::default())
            .unwrap();
        let closed = ("14".to_string(), events::CONNECTION_CLOSED.to_string());
        assert_eq!(end(&client, id), closed, "{path}");
        client.close(id);
    }
    // Their transport ended them as they started: nothing of theirs
    // stays behind, however many such calls come.
    assert_eq!(lock(&client.inner.calls).len(), 0);
}

#[test]
fn calls_that_end_leave_no_token_behind() {
    let client = client();
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protos/route_guide.proto");
    client.load_file(&proto, &[]).unwrap();
    let conn = dead_conn(&client);
    let options = CallOptions::default();
    let id = client
        .start(conn, SAY_HELLO, Some(br#"{"name":"a"}"#), &options)
        .unwrap();
    let stream = client
        .start(conn, "/routeguide.RouteGuide/RouteChat", None, &options)
        .unwrap();
    let tokens: Vec<Token> = lock(&client.inner.calls)
        .iter()
        .filter(|(_, call)| call.is_unary())
        .map(|(token, _)| *token)
        .collect();
    assert_eq!(tokens.len(), 1);
    assert_eq!(lock(&client.inner.host).live_tokens(), 2);
    // A unary call that succeeds ends with its message, no close after
    // it (Envoy's order): every such call held its token for good, and
    // the host's set of them grew for the worker's life (make soak).
    let reply = b"\x0a\x05hi a!".to_vec();
    let woken = client.produced(
        tokens
            .iter()
            .map(|&token| {
                let answer = events::unary_answer(
                    HeaderBlock::default(),
                    HeaderBlock::default(),
                    vec![reply.clone()],
                );
                (token, answer)
            })
            .collect(),
    );
    assert!(woken.contains(&id), "{woken:?}");
    assert_eq!(end(&client, id), ("0".to_string(), "hi a!".to_string()));
    client.close(id);
    // The stream has not ended: its token stays held.
    assert_eq!(lock(&client.inner.host).live_tokens(), 1);
    client.close(stream);
    assert_eq!(lock(&client.inner.host).live_tokens(), 0);
}

#[test]
fn closing_a_connection_ends_its_calls_unavailable_and_later_ones_too() {
    let client = client();
    let conn = dead_conn(&client);
    let running = in_flight(&client, conn);
    client.send(running, br#"{"name":"a"}"#, true).unwrap();
    client.close_send(running).unwrap();
    assert_eq!(lock(&client.inner.calls).len(), 1);
    client.close_conn(conn);
    let closed = ("14".to_string(), events::CONNECTION_CLOSED.to_string());
    assert_eq!(end(&client, running), closed);
    assert_eq!(lock(&client.inner.calls).len(), 0);
    assert!(matches!(
        client.start(conn, SAY_HELLO, Some(b"{}"), &CallOptions::default()),
        Err(ClientError::UnknownConn)
    ));
    client.close(running);
}

#[test]
fn a_trap_rebuilds_the_instance_and_fails_its_calls_with_internal() {
    let client = client();
    let conn = dead_conn(&client);
    let waiting = in_flight(&client, conn);
    let id = trapping_call(&client, conn);
    assert_eq!(end(&client, id), ("13".to_string(), LOST.to_string()));
    assert_eq!(end(&client, waiting), ("13".to_string(), LOST.to_string()));
    assert_eq!(client.next_event(waiting), None);
    assert_serving(&client, conn);
    client.close(id);
    client.close(waiting);
}

#[test]
fn a_load_that_traps_the_module_leaves_what_was_loaded_as_it_was() {
    let client = client();
    let conn = dead_conn(&client);
    // The configuration must grow the module's memory; it cannot.
    // One file with a 2 MiB package name (2 << 20 as a varint).
    let mut file = b"\x0a\x09big.proto\x12\x80\x80\x80\x01".to_vec();
    file.resize(file.len() + (2 << 20), b'x');
    let mut set = Vec::new();
    grpc_wasm::descriptors::push_file(&mut set, &file);
    let result = with_memory_capped(&client, || client.load_descriptor_set(&set));
    assert!(
        matches!(result, Err(ClientError::Host(HostError::Trap(_)))),
        "{result:?}"
    );
    // The rebuilt instance took the set from before the load: it
    // serves the files loaded then.
    assert_serving(&client, conn);
}

#[test]
fn a_refused_load_leaves_the_module_serving_what_was_loaded() {
    let client = client();
    let conn = dead_conn(&client);
    let result = client.load_descriptor_set(b"\xff");
    assert!(matches!(result, Err(ClientError::Host(_))), "{result:?}");
    assert_serving(&client, conn);
    // Nothing of the refused set is kept: the next load does not carry it.
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protos/helloworld.proto");
    client.load_file(&proto, &[]).unwrap();
    assert_serving(&client, conn);
}

#[test]
fn traps_under_load_end_every_call_in_flight_and_the_instance_keeps_serving() {
    let client = client();
    let conn = dead_conn(&client);
    for _ in 0..10 {
        let waiting: Vec<CallId> = (0..200).map(|_| in_flight(&client, conn)).collect();
        let id = trapping_call(&client, conn);
        for &call in waiting.iter().chain([&id]) {
            assert_eq!(end(&client, call), ("13".to_string(), LOST.to_string()));
            assert_eq!(client.next_event(call), None);
            client.close(call);
        }
        assert_serving(&client, conn);
    }
    // Ten traps leave nothing behind on the host's side either.
    assert!(lock(&client.inner.events).is_empty());
    assert!(lock(&client.inner.calls).is_empty());
}

#[test]
fn a_queue_at_its_cap_closes_its_gate_and_taking_below_it_opens_it() {
    let gate = Arc::new(Gate::default());
    let mut queue = Queue {
        gate: Some(gate.clone()),
        ..Queue::default()
    };
    queue.push(Event::Message(vec![b'x'; 6]), 10);
    assert!(!gate.is_closed());
    queue.push(Event::Message(vec![b'y'; 6]), 10);
    assert!(gate.is_closed());
    assert_eq!(queue.bytes, 12);
    assert_eq!(queue.pop(10), (Some(Event::Message(vec![b'x'; 6])), true));
    assert!(!gate.is_closed());
    // Already open: nothing to resume.
    assert_eq!(queue.pop(10), (Some(Event::Message(vec![b'y'; 6])), false));
    assert_eq!((queue.bytes, queue.pop(10)), (0, (None, false)));
}

#[test]
fn metadata_that_could_smuggle_entries_is_refused() {
    let ok = [("x-id".to_string(), "7".to_string())];
    assert!(check_metadata(&ok).is_ok());
    let nul = [("a".to_string(), "x\0authorization\0Bearer x".to_string())];
    let crlf = [("a".to_string(), "x\r\nauthorization: Bearer x".to_string())];
    let key = [("a\0b".to_string(), "x".to_string())];
    let message = |m: &[(String, String)]| check_metadata(m).unwrap_err().to_string();
    let control = "metadata value of 'a' is not printable ASCII (0x20-0x7E: no NUL, CR, LF or other control character); binary values need a key ending in -bin";
    assert_eq!(message(&nul), control);
    assert_eq!(message(&crlf), control);
    assert_eq!(
        message(&key),
        "invalid metadata key 'a?b': only letters, digits, '-', '_' and '.'"
    );
}

/// A transport with a bug: starting a call on it panics, while the
/// client holds the module and its tables.
struct Panicking;

impl crate::transport::CallTransport for Panicking {
    fn unary(
        &self,
        _: crate::transport::NewCall<'_>,
        _: Vec<u8>,
        _: u32,
    ) -> crate::transport::Started {
        panic!("injected: a transport's bug");
    }

    fn stream(&self, _: crate::transport::NewCall<'_>, _: Arc<Gate>) -> crate::transport::Started {
        panic!("injected: a transport's bug");
    }
}

#[test]
fn a_panic_fails_the_calls_and_connections_and_the_client_serves_after_it() {
    let client = client();
    let other = dead_conn(&client);
    let waiting = in_flight(&client, other);
    let buggy = client.register(Arc::new(Panicking));
    let started = client.contain(|| {
        client.start(
            buggy,
            SAY_HELLO,
            Some(br#"{"name":"a"}"#),
            &CallOptions::default(),
        )
    });
    let Err(ClientError::Panicked(what)) = started else {
        panic!("expected the panic to be contained, got {started:?}");
    };
    assert_eq!(what, "injected: a transport's bug");
    // Nothing the panic interrupted is used as it was left.
    for poisoned in [
        client.inner.host.is_poisoned(),
        client.inner.calls.is_poisoned(),
        client.inner.events.is_poisoned(),
        client.inner.conns.is_poisoned(),
    ] {
        assert!(!poisoned);
    }
    let lost = "the shim failed (panic: injected: a transport's bug); its state was rebuilt and \
                this call was lost";
    assert_eq!(end(&client, waiting), ("13".to_string(), lost.to_string()));
    assert_eq!(lock(&client.inner.calls).len(), 0);
    // Every connection is closed: no call starts on one, and its socket
    // is no longer the caller's to drive.
    let options = CallOptions::default();
    let again = client.start(other, SAY_HELLO, None, &options);
    assert!(matches!(again, Err(ClientError::UnknownConn)), "{again:?}");
    let state = client.wire_state(other);
    assert!(matches!(state, Err(ClientError::UnknownConn)), "{state:?}");
    // A new connection serves, on the rebuilt instance.
    let conn = dead_conn(&client);
    assert_serving(&client, conn);
}

#[test]
fn a_panic_while_rebuilding_after_a_panic_does_not_unwind_further() {
    let wasm = module();
    // A caller whose wake-up panics: rebuilding wakes the calls it fails.
    let wake: Wake = Arc::new(|_| panic!("injected: a wake-up's bug"));
    let client = Client::new(&wasm, None, wake).expect("the module loads");
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protos/helloworld.proto");
    client
        .load_file(&proto, &[])
        .expect("helloworld.proto loads");
    let waiting = in_flight(&client, dead_conn(&client));
    let buggy = client.register(Arc::new(Panicking));
    let options = CallOptions::default();
    // Both panics stay inside: the first is returned, the second logged.
    let started = client.contain(|| client.start(buggy, SAY_HELLO, Some(b"{}"), &options));
    assert!(
        matches!(started, Err(ClientError::Panicked(_))),
        "{started:?}"
    );
    assert!(!client.inner.host.is_poisoned() && !client.inner.events.is_poisoned());
    assert_eq!(end(&client, waiting).0, "13");
}

#[test]
fn reflection_loads_are_bounded_per_worker_and_a_close_frees_one_with_its_token() {
    let client = client();
    let conn = dead_conn(&client);
    let tokens = lock(&client.inner.host).live_tokens();
    // No socket feeds the connection: each load stays in flight.
    let loads: Vec<CallId> = (0..crate::limits::MAX_REFLECTIONS)
        .map(|_| client.reflect(conn, None, Duration::from_secs(10)).unwrap())
        .collect();
    assert_eq!(lock(&client.inner.host).live_tokens(), tokens + loads.len());
    let refused = client
        .reflect(conn, None, Duration::from_secs(10))
        .unwrap_err()
        .to_string();
    assert_eq!(
        refused,
        "4 reflection loads are running in this worker already; wait for one to end"
    );
    client.close(loads[0]);
    assert_eq!(
        lock(&client.inner.host).live_tokens(),
        tokens + loads.len() - 1
    );
    let again = client.reflect(conn, None, Duration::from_secs(10)).unwrap();
    // A load not finished has no set to take.
    assert_eq!(
        client.reflected(again).unwrap_err().to_string(),
        "no finished reflection load has this id"
    );
    for id in loads.iter().skip(1).chain([&again]) {
        client.close(*id);
    }
    assert_eq!(lock(&client.inner.host).live_tokens(), tokens);
    assert!(lock(&client.inner.reflections).is_empty());
    assert_serving(&client, conn);
}

#[test]
fn a_trap_ends_the_reflection_loads_in_flight_with_the_calls() {
    let client = client();
    let conn = dead_conn(&client);
    let load = client
        .reflect(
            conn,
            Some(&["helloworld.Greeter".to_string()]),
            Duration::from_secs(10),
        )
        .unwrap();
    let id = trapping_call(&client, conn);
    assert_eq!(end(&client, load), ("13".to_string(), LOST.to_string()));
    assert_eq!(end(&client, id), ("13".to_string(), LOST.to_string()));
    assert!(lock(&client.inner.reflections).is_empty());
    client.close(load);
    client.close(id);
    assert_serving(&client, conn);
}

#[test]
fn an_unknown_connection_cannot_reflect() {
    let client = client();
    let err = client
        .reflect(ConnId(999), None, Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(err.to_string(), "unknown or closed connection");
}

#[test]
fn a_load_its_caller_abandoned_past_its_deadline_gives_its_slot_to_the_next() {
    let client = client();
    let conn = dead_conn(&client);
    let tokens = lock(&client.inner.host).live_tokens();
    // Callers that never close their loads (killed while they waited).
    for _ in 0..crate::limits::MAX_REFLECTIONS {
        client
            .reflect(conn, None, Duration::from_millis(1))
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(1100));
    let id = client.reflect(conn, None, Duration::from_secs(10)).unwrap();
    assert_eq!(lock(&client.inner.reflections).len(), 1);
    assert_eq!(lock(&client.inner.host).live_tokens(), tokens + 1);
    assert_eq!(lock(&client.inner.events).len(), 1);
    client.close(id);
    assert_eq!(lock(&client.inner.host).live_tokens(), tokens);
}

/// Whether call `id`'s end has arrived (without taking it).
fn has_ended(client: &Client, id: CallId) -> bool {
    lock(&client.inner.events)
        .get(&id)
        .is_some_and(|queue| queue.ended)
}

#[test]
fn closing_failed_reflection_loads_while_calls_start_never_deadlocks() {
    let client = client();
    // A load to nowhere fails on the runtime's thread, ending its call.
    let down = client
        .connect("127.0.0.1:1", &TlsOptions::default(), &Keepalive::default())
        .unwrap();
    let wire = dead_conn(&client);
    let stop = Arc::new(AtomicBool::new(false));
    let starter = {
        let (client, stop) = (client.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = in_flight(&client, wire);
                client.close(id);
            }
        })
    };
    let (done, finished) = std::sync::mpsc::channel();
    let closer = client.clone();
    std::thread::spawn(move || {
        for _ in 0..100 {
            let id = closer.reflect(down, None, Duration::from_secs(10)).unwrap();
            while !has_ended(&closer, id) {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Closed before its failure is read, as conn:reflect does.
            closer.close(id);
        }
        let _ = done.send(());
    });
    let ended = finished.recv_timeout(Duration::from_secs(60));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        ended.is_ok(),
        "closing a failed load deadlocked against a starting call"
    );
    starter.join().unwrap();
}
