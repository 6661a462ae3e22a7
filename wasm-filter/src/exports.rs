//! The core's own exports, for hosts that call it directly rather than as a
//! proxy-wasm filter (the smoke test, the benchmark, embedders).
//!
//! Memory contract: the host writes its inputs into the module's scratch
//! buffer (`grpc_wasm_buffer(len)` returns its address, valid until the next
//! `grpc_wasm_buffer` call), or into buffers of its own from
//! `grpc_wasm_alloc` / `grpc_wasm_free`. Each operation returns 0 on success
//! or 1 on error; either way its output (result bytes, or the UTF-8 error
//! text) is found with `grpc_wasm_result` (address << 32 | length) and stays
//! valid until the next operation. One scratch buffer and one packed result
//! keep a call to three boundary crossings. Nothing here panics on bad
//! input: every name and payload the host passes is checked and reported as
//! an error.

use std::cell::RefCell;

use prost_reflect::MessageDescriptor;

use crate::json::{decode_message, json_to_protobuf, protobuf_to_json, JsonOptions};
use crate::{encode_deterministic, Registry};

struct State {
    registry: Registry,
    options: JsonOptions,
    result: Vec<u8>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State {
        registry: Registry::default(),
        options: JsonOptions::default(),
        result: Vec::new(),
    });
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The scratch input buffer, grown to at least `len` bytes.
#[no_mangle]
pub extern "C" fn grpc_wasm_buffer(len: usize) -> *mut u8 {
    SCRATCH.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        buf.as_mut_ptr()
    })
}

/// The module's version (`crate::VERSION`): address in the high 32 bits,
/// length in the low. A host built from another version refuses the module.
#[no_mangle]
pub extern "C" fn grpc_wasm_module_version() -> u64 {
    let version = crate::VERSION.as_bytes();
    ((version.as_ptr() as usize as u64) << 32) | version.len() as u64
}

/// The last operation's output: address in the high 32 bits, length in the low.
#[no_mangle]
pub extern "C" fn grpc_wasm_result() -> u64 {
    STATE.with(|s| {
        let state = s.borrow();
        ((state.result.as_ptr() as usize as u64) << 32) | state.result.len() as u64
    })
}

/// Allocates `len` bytes for the host to write an input into.
#[no_mangle]
pub extern "C" fn grpc_wasm_alloc(len: usize) -> *mut u8 {
    let mut buf = Vec::<u8>::with_capacity(len.max(1));
    let ptr = buf.as_mut_ptr();
    std::mem::forget(buf);
    ptr
}

/// Frees a buffer from `grpc_wasm_alloc`, given the same length.
///
/// # Safety
/// `ptr` and `len` must come from one `grpc_wasm_alloc` call.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_free(ptr: *mut u8, len: usize) {
    if !ptr.is_null() {
        // SAFETY: `ptr` and `len` come from one `grpc_wasm_alloc`, which
        // made a `Vec<u8>` of capacity `len.max(1)` (this function's contract).
        drop(unsafe { Vec::from_raw_parts(ptr, 0, len.max(1)) });
    }
}

/// Compiles one `.proto` file (name and source, both UTF-8). Not in a
/// module built without the compiler.
///
/// # Safety
/// The pointers must address `len` readable bytes of this module's memory.
#[cfg(feature = "compiler")]
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_load_proto(
    name: *const u8,
    name_len: usize,
    source: *const u8,
    source_len: usize,
) -> u32 {
    // SAFETY: each pointer addresses its length in bytes (this function's contract).
    let (name, source) = unsafe { (bytes(name, name_len), bytes(source, source_len)) };
    run(|state| {
        let name = utf8(name, "file name")?;
        let source = utf8(source, "file source")?;
        state
            .registry
            .add_sources([(name, source)])
            .map_err(|e| e.to_string())?;
        Ok(Vec::new())
    })
}

/// The files a `.proto` source imports, one per line: hosts that read
/// sources from disk resolve them before `load_proto` or configuration.
///
/// # Safety
/// The pointers must address `len` readable bytes of this module's memory.
#[cfg(feature = "compiler")]
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_proto_imports(
    name: *const u8,
    name_len: usize,
    source: *const u8,
    source_len: usize,
) -> u32 {
    // SAFETY: each pointer addresses its length in bytes (this function's contract).
    let (name, source) = unsafe { (bytes(name, name_len), bytes(source, source_len)) };
    run(|_| {
        let name = utf8(name, "file name")?;
        let source = utf8(source, "file source")?;
        let imports = crate::descriptors::imports_of(name, source).map_err(|e| e.to_string())?;
        Ok(imports.join("\n").into_bytes())
    })
}

/// Every file the plugin configuration of root context `root_id` loaded,
/// as an encoded `FileDescriptorSet`. Only in the module the shim runs
/// (the one with the compiler): the lite module would carry an encoder
/// for nobody.
#[cfg(feature = "compiler")]
#[no_mangle]
pub extern "C" fn grpc_wasm_descriptor_set(root_id: u32) -> u32 {
    run(|_| crate::proxy::filter::descriptor_set(crate::contract::ContextId(root_id)))
}

/// Sets the JSON options from their bit set (`JsonOptions::bits`).
#[no_mangle]
pub extern "C" fn grpc_wasm_set_json_options(flags: u32) -> u32 {
    run(|state| {
        state.options = JsonOptions::from_bits(flags);
        Ok(Vec::new())
    })
}

/// JSON → protobuf for the message type named by `type_name`.
///
/// # Safety
/// The pointers must address `len` readable bytes of this module's memory.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_json_to_proto(
    type_name: *const u8,
    type_len: usize,
    json: *const u8,
    json_len: usize,
) -> u32 {
    // SAFETY: each pointer addresses its length in bytes (this function's contract).
    let (type_name, json) = unsafe { (bytes(type_name, type_len), bytes(json, json_len)) };
    run_typed(type_name, |desc, options| {
        json_to_protobuf(desc, json, options)
    })
}

/// protobuf → JSON for the message type named by `type_name`.
///
/// # Safety
/// The pointers must address `len` readable bytes of this module's memory.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_proto_to_json(
    type_name: *const u8,
    type_len: usize,
    message: *const u8,
    message_len: usize,
) -> u32 {
    // SAFETY: each pointer addresses its length in bytes (this function's contract).
    let (type_name, message) = unsafe { (bytes(type_name, type_len), bytes(message, message_len)) };
    run_typed(type_name, |desc, options| {
        protobuf_to_json(desc, message, options).map(String::into_bytes)
    })
}

/// Decodes protobuf and encodes it again deterministically: what a
/// reference suite needs to check the decoder alone.
///
/// # Safety
/// The pointers must address `len` readable bytes of this module's memory.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_proto_to_proto(
    type_name: *const u8,
    type_len: usize,
    message: *const u8,
    message_len: usize,
) -> u32 {
    // SAFETY: each pointer addresses its length in bytes (this function's contract).
    let (type_name, message) = unsafe { (bytes(type_name, type_len), bytes(message, message_len)) };
    run_typed(type_name, |desc, _| {
        decode_message(desc, message).map(|m| encode_deterministic(&m))
    })
}

/// Runs a conversion for the message type the host named.
fn run_typed(
    type_name: &[u8],
    convert: impl FnOnce(&MessageDescriptor, &JsonOptions) -> Result<Vec<u8>, crate::Error>,
) -> u32 {
    run(|state| {
        let desc = state
            .registry
            .message(utf8(type_name, "type name")?)
            .map_err(|e| e.to_string())?;
        convert(&desc, &state.options).map_err(|e| e.to_string())
    })
}

fn run(f: impl FnOnce(&mut State) -> Result<Vec<u8>, String>) -> u32 {
    STATE.with(|cell| {
        let mut state = cell.borrow_mut();
        let (code, result) = match f(&mut state) {
            Ok(out) => (0, out),
            Err(message) => (1, message.into_bytes()),
        };
        state.result = result;
        code
    })
}

/// # Safety
/// `ptr` is NULL, or addresses `len` readable bytes of this module's memory
/// that the host leaves alone for `'a`.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: not NULL, and `len` bytes are readable (this function's contract).
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

fn utf8<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, String> {
    std::str::from_utf8(bytes).map_err(|_| format!("{what} is not valid UTF-8"))
}
