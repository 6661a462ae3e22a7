//! Times N sequential unary calls through `lua_shim::Client` (module +
//! transport, no nginx): what the shim costs before the hop back to Lua.
//! Usage: client_bench WASM ADDR PROTO N

use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use lua_shim::{Client, Event};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let wasm = std::fs::read(&args[1])?;
    let n: usize = args[4].parse()?;
    let signal = Arc::new((Mutex::new(0u64), Condvar::new()));
    let wake = {
        let signal = signal.clone();
        Arc::new(move |_id: lua_shim::call::CallId| {
            *signal.0.lock().unwrap() += 1;
            signal.1.notify_one();
        })
    };
    let client = Client::new(&wasm, Some(std::path::Path::new("/tmp")), wake)?;
    client.load_file(std::path::Path::new(&args[3]), &[])?;
    let conn = client.connect(&args[2], &Default::default(), &Default::default())?;
    let started = Instant::now();
    for _ in 0..n {
        let id = client.start(
            conn,
            "/helloworld.Greeter/SayHello",
            Some(br#"{"name":"bench"}"#),
            &Default::default(),
        )?;
        loop {
            if let Some(Event::End(reply)) = client.next_event(id) {
                assert_eq!(reply.body, br#"{"message":"Hello bench!"}"#);
                break;
            }
            let guard = signal.0.lock().unwrap();
            let _unused = signal
                .1
                .wait_timeout(guard, std::time::Duration::from_millis(1))
                .unwrap();
        }
        client.close(id);
    }
    println!(
        "{n} calls: {:.1} us/call",
        started.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    Ok(())
}
