//! The WASI preview1 functions a proxy gives its wasm modules, and nothing
//! more: no files, no sockets, no clocks beyond what the module asks for.
//!
//! Written here rather than taken from wasmtime-wasi because a proxy-wasm
//! host must not grant a filesystem or the component model, and Envoy
//! itself implements exactly this kind of subset. Each function checks
//! every pointer the module passes; a bad one is an errno, never a host
//! crash.

use wasmtime::{Caller, Extern, Linker, Memory};

const ERRNO_SUCCESS: i32 = 0;
const ERRNO_BADF: i32 = 8;
const ERRNO_FAULT: i32 = 21;
const ERRNO_IO: i32 = 29;

const MODULE: &str = "wasi_snapshot_preview1";

/// Adds the subset to a linker whose store data is `T`.
pub fn add_to_linker<T: 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap(MODULE, "random_get", random_get::<T>)?;
    linker.func_wrap(MODULE, "environ_sizes_get", sizes_get::<T>)?;
    linker.func_wrap(MODULE, "environ_get", |_: Caller<'_, T>, _: i32, _: i32| {
        ERRNO_SUCCESS
    })?;
    linker.func_wrap(MODULE, "args_sizes_get", sizes_get::<T>)?;
    linker.func_wrap(MODULE, "args_get", |_: Caller<'_, T>, _: i32, _: i32| {
        ERRNO_SUCCESS
    })?;
    linker.func_wrap(MODULE, "fd_write", fd_write::<T>)?;
    linker.func_wrap(MODULE, "clock_time_get", clock_time_get::<T>)?;
    linker.func_wrap(
        MODULE,
        "proc_exit",
        |_: Caller<'_, T>, code: i32| -> wasmtime::Result<()> {
            Err(wasmtime::Error::msg(format!(
                "wasm module called proc_exit({code})"
            )))
        },
    )?;
    Ok(())
}

fn memory<T>(caller: &mut Caller<'_, T>) -> Option<Memory> {
    match caller.get_export("memory") {
        Some(Extern::Memory(m)) => Some(m),
        _ => None,
    }
}

fn random_get<T>(mut caller: Caller<'_, T>, ptr: i32, len: i32) -> i32 {
    let Some(mem) = memory(&mut caller) else {
        return ERRNO_FAULT;
    };
    let Some(buf) = slice_mut(mem.data_mut(&mut caller), ptr, len) else {
        return ERRNO_FAULT;
    };
    match getrandom::fill(buf) {
        Ok(()) => ERRNO_SUCCESS,
        Err(_) => ERRNO_IO,
    }
}

/// No environment variables and no arguments: both counts are zero.
fn sizes_get<T>(mut caller: Caller<'_, T>, count_ptr: i32, size_ptr: i32) -> i32 {
    let Some(mem) = memory(&mut caller) else {
        return ERRNO_FAULT;
    };
    let data = mem.data_mut(&mut caller);
    for ptr in [count_ptr, size_ptr] {
        let Some(out) = slice_mut(data, ptr, 4) else {
            return ERRNO_FAULT;
        };
        out.copy_from_slice(&0u32.to_le_bytes());
    }
    ERRNO_SUCCESS
}

/// stdout and stderr go to the host's stderr (a module has no business
/// writing to a proxy's stdout); other descriptors do not exist.
fn fd_write<T>(
    mut caller: Caller<'_, T>,
    fd: i32,
    iovs: i32,
    iovs_len: i32,
    written_ptr: i32,
) -> i32 {
    use std::io::Write;
    if fd != 1 && fd != 2 {
        return ERRNO_BADF;
    }
    let Some(mem) = memory(&mut caller) else {
        return ERRNO_FAULT;
    };
    let data = mem.data_mut(&mut caller);
    let mut total: u32 = 0;
    let mut stderr = std::io::stderr().lock();
    for i in 0..iovs_len.max(0) {
        let Some(iov) = iovs.checked_add(i * 8).and_then(|p| slice(data, p, 8)) else {
            return ERRNO_FAULT;
        };
        let (ptr, len) = (le_u32(&iov[0..4]), le_u32(&iov[4..8]));
        let Some(bytes) = slice(data, ptr as i32, len as i32) else {
            return ERRNO_FAULT;
        };
        if stderr.write_all(bytes).is_err() {
            return ERRNO_IO;
        }
        total = total.saturating_add(len);
    }
    match slice_mut(data, written_ptr, 4) {
        Some(out) => {
            out.copy_from_slice(&total.to_le_bytes());
            ERRNO_SUCCESS
        }
        None => ERRNO_FAULT,
    }
}

fn clock_time_get<T>(mut caller: Caller<'_, T>, _clock: i32, _precision: i64, out_ptr: i32) -> i32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let Some(mem) = memory(&mut caller) else {
        return ERRNO_FAULT;
    };
    match slice_mut(mem.data_mut(&mut caller), out_ptr, 8) {
        Some(out) => {
            out.copy_from_slice(&nanos.to_le_bytes());
            ERRNO_SUCCESS
        }
        None => ERRNO_FAULT,
    }
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn range(len_of_memory: usize, ptr: i32, len: i32) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(ptr as u32).ok()?;
    let end = start.checked_add(usize::try_from(len as u32).ok()?)?;
    (end <= len_of_memory).then_some(start..end)
}

fn slice(data: &[u8], ptr: i32, len: i32) -> Option<&[u8]> {
    range(data.len(), ptr, len).map(|r| &data[r])
}

fn slice_mut(data: &mut [u8], ptr: i32, len: i32) -> Option<&mut [u8]> {
    range(data.len(), ptr, len).map(move |r| &mut data[r])
}
