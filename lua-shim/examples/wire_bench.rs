//! Times N sequential SayHello calls over `transport::wire` driven from one
//! thread with a blocking socket: the transport alone, without the module
//! or nginx. Usage: wire_bench ADDR N
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use lua_shim::call::{GrpcEvent, GrpcTarget, Token};
use lua_shim::transport::wire::Wire;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args[2].parse()?;
    let mut sock = TcpStream::connect(&args[1])?;
    sock.set_nodelay(true)?;
    let mut wire = Wire::new(&args[1], None)?;
    let mut buf = vec![0u8; 65536];
    let started = Instant::now();
    for i in 0..n {
        let token = Token(i as u32 + 1);
        let target = GrpcTarget {
            upstream: "1".into(),
            service: "helloworld.Greeter".into(),
            method: "SayHello".into(),
            metadata: vec![],
            compression: Default::default(),
        };
        let mut produced = wire.unary(token, target, b"\x0a\x05bench", 10_000);
        loop {
            if produced.iter().any(|(t, ev)| {
                *t == token
                    && ev
                        .iter()
                        .any(|e| matches!(e, GrpcEvent::Message(_) | GrpcEvent::Close(..)))
            }) {
                break;
            }
            let out = wire.take_output();
            if !out.is_empty() {
                sock.write_all(&out)?;
            }
            let got = sock.read(&mut buf)?;
            if got == 0 {
                return Err("server closed".into());
            }
            produced = wire.input(&buf[..got]);
        }
        let out = wire.take_output();
        if !out.is_empty() {
            sock.write_all(&out)?;
        }
    }
    println!(
        "{n} calls: {:.1} us/call",
        started.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    Ok(())
}
