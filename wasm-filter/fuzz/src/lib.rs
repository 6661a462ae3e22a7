//! What every fuzz target shares: the hosts' stack size, the fuzz schema,
//! and JSON options picked by input bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, OnceLock};

use grpc_wasm::{JsonOptions, Registry};

pub mod filter;

/// The stack a wasm host gives the module (wasmtime's default
/// `max_wasm_stack`; V8's is smaller still in frames of this size): each
/// input runs on a thread this small, so that a walk deep enough to trap
/// the module in a proxy overflows here too and counts as a crash.
pub const HOST_STACK: usize = 512 * 1024;

/// Runs `target` on `data` on a worker thread whose stack is
/// [`HOST_STACK`]. One thread serves every input (a thread per input cost
/// more than most targets); a panic there aborts the process through
/// libFuzzer's hook, which is what the fuzzer reports.
pub fn on_host_stack(data: &[u8], target: fn(&[u8])) {
    type Job = (fn(&[u8]), Vec<u8>);
    static WORKER: OnceLock<Mutex<(Sender<Job>, Receiver<()>)>> = OnceLock::new();
    let worker = WORKER.get_or_init(|| {
        let (jobs, inbox) = channel::<Job>();
        let (done, finished) = channel();
        std::thread::Builder::new()
            .name("fuzz-host-stack".into())
            .stack_size(HOST_STACK)
            .spawn(move || {
                report_overflows_on_an_alternate_stack();
                for (target, data) in inbox {
                    target(&data);
                    if done.send(()).is_err() {
                        return;
                    }
                }
            })
            .expect("spawning the fuzz worker thread");
        Mutex::new((jobs, finished))
    });
    let worker = worker
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    worker
        .0
        .send((target, data.to_vec()))
        .expect("the fuzz worker is alive");
    worker.1.recv().expect("the fuzz worker finished the input");
}

/// libFuzzer's crash handler runs on the stack that faulted, so a stack
/// overflow would fault again inside it and die without saving the input.
/// As ASan does, give the worker an alternate signal stack and have the
/// handler run there.
fn report_overflows_on_an_alternate_stack() {
    const ALTERNATE_STACK: usize = 64 * 1024;
    let stack: &'static mut [u8] = Box::leak(vec![0u8; ALTERNATE_STACK].into_boxed_slice());
    let alternate = libc::stack_t {
        ss_sp: stack.as_mut_ptr().cast(),
        ss_flags: 0,
        ss_size: ALTERNATE_STACK,
    };
    // SAFETY: the stack is leaked, so it outlives the thread it serves.
    let installed = unsafe { libc::sigaltstack(&alternate, std::ptr::null_mut()) } == 0;
    assert!(installed, "sigaltstack failed");
    for signal in [libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: an all-zero `sigaction` is a valid value to be filled in.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reads the current handler into `action`.
        unsafe { libc::sigaction(signal, std::ptr::null(), &mut action) };
        action.sa_flags |= libc::SA_ONSTACK;
        // SAFETY: the same handler libFuzzer installed, now on the alternate stack.
        unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
    }
}

/// The largest single allocation an input may cause. The core's own limits
/// keep every buffer a few MiB at most (4 MiB messages, growth doubling
/// them); an allocation past this is runaway memory, reported as a crash.
/// Without a sanitizer libFuzzer's `-malloc_limit_mb` sees nothing, so
/// the allocator checks it.
pub const MAX_ALLOCATION: usize = 64 << 20;

struct Bounded;

// SAFETY: every call is passed on unchanged to the system allocator, whose
// contract this upholds; the check only aborts before calling it.
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn check(size: usize) {
    if size > MAX_ALLOCATION {
        // No formatting here: it would allocate.
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"==fuzz== an allocation over MAX_ALLOCATION (64 MiB)\n",
        );
        std::process::abort();
    }
}

#[global_allocator]
static ALLOCATOR: Bounded = Bounded;

/// The registry with `schema/fuzz.proto` loaded, built once per process.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut registry = Registry::new().expect("the bundled files compile");
        registry
            .add_sources([("fuzz.proto", include_str!("../schema/fuzz.proto"))])
            .expect("schema/fuzz.proto compiles");
        registry
    })
}

/// An empty registry (the bundled files only), cloned from one built once:
/// building it compiles the bundled `.proto` files.
pub fn fresh_registry() -> Registry {
    static BASE: OnceLock<Registry> = OnceLock::new();
    BASE.get_or_init(|| Registry::new().expect("the bundled files compile"))
        .clone()
}

/// The message types a target can pick with one byte: the schema's
/// message and each well-known type whose JSON form is special.
pub const MESSAGE_TYPES: [&str; 12] = [
    "grpcwasm.fuzz.Everything",
    "google.protobuf.Any",
    "google.protobuf.Struct",
    "google.protobuf.Value",
    "google.protobuf.ListValue",
    "google.protobuf.Timestamp",
    "google.protobuf.Duration",
    "google.protobuf.FieldMask",
    "google.protobuf.Int64Value",
    "google.protobuf.BytesValue",
    "google.rpc.Status",
    "google.protobuf.Empty",
];

/// Options from the low five bits of `bits`.
pub fn json_options(bits: u8) -> JsonOptions {
    JsonOptions {
        emit_defaults: bits & 1 != 0,
        int64_as_number: bits & 2 != 0,
        enums_as_numbers: bits & 4 != 0,
        proto_field_names: bits & 8 != 0,
        ignore_unknown_fields: bits & 16 != 0,
    }
}

/// Splits `data` into its first `N` bytes and the rest; `None` when shorter.
pub fn header<const N: usize>(data: &[u8]) -> Option<([u8; N], &[u8])> {
    let head = data.get(..N)?.try_into().ok()?;
    Some((head, &data[N..]))
}
