//! The native baseline of `make bench-lua`: the same SayHello calls as the
//! Lua benchmark, from a plain tonic client (generated code, prost).
//!
//! Usage: tonic-bench --addr ADDR --calls N --concurrency C
//! Prints `seconds S` for the timed run (after a warm-up).

use std::time::Instant;

use clap::Parser;
use host_tests::pb::helloworld::greeter_client::GreeterClient;
use host_tests::pb::helloworld::HelloRequest;
use host_tests::BoxError;
use tonic::transport::Channel;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    addr: String,
    #[arg(long, default_value_t = 100_000)]
    calls: usize,
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    #[arg(long, default_value_t = 2_000)]
    warmup: usize,
    /// Run everything on one thread (tokio's current-thread runtime).
    #[arg(long)]
    current_thread: bool,
    /// A deadline on every call (sent as grpc-timeout), as resty.ffi.grpc
    /// always sends one.
    #[arg(long)]
    timeout_ms: Option<u64>,
}

async fn run(
    client: GreeterClient<Channel>,
    calls: usize,
    concurrency: usize,
    timeout: Option<std::time::Duration>,
) -> Result<(), BoxError> {
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let mut client = client.clone();
        let share = calls / concurrency + usize::from(worker < calls % concurrency);
        tasks.push(tokio::spawn(async move {
            for _ in 0..share {
                let mut request = tonic::Request::new(HelloRequest {
                    name: "bench".into(),
                });
                if let Some(timeout) = timeout {
                    request.set_timeout(timeout);
                }
                let reply = client.say_hello(request).await?;
                if reply.get_ref().message != "Hello bench!" {
                    return Err::<(), BoxError>("unexpected reply".into());
                }
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let runtime = if args.current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()?;
    runtime.block_on(bench(args))
}

async fn bench(args: Args) -> Result<(), BoxError> {
    let channel = Channel::from_shared(format!("http://{}", args.addr))?
        .connect()
        .await?;
    let client = GreeterClient::new(channel);
    let timeout = args.timeout_ms.map(std::time::Duration::from_millis);
    run(
        client.clone(),
        args.warmup,
        args.concurrency.min(args.warmup.max(1)),
        timeout,
    )
    .await?;
    let started = Instant::now();
    run(client, args.calls, args.concurrency, timeout).await?;
    println!("seconds {:.3}", started.elapsed().as_secs_f64());
    Ok(())
}
