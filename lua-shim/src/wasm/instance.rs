//! What every host of the module does the same way: instantiate it (WASI
//! subset, constructors, memory) and report failures as one error type.

use wasmtime::{Engine, Instance, Linker, Memory, Module, Store, TypedFunc};

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot load the wasm module: {0}")]
    Load(String),
    #[error("the wasm module lacks the export '{0}'")]
    MissingExport(&'static str),
    #[error("the wasm module trapped: {0}")]
    Trap(String),
    #[error("the wasm module returned an out-of-bounds buffer")]
    BadBuffer,
    #[error("no free call id after {0} tries: calls are never closed?")]
    Busy(u32),
    /// The module refused the input or the configuration; the text is its reason.
    #[error("{0}")]
    Core(String),
}

pub(crate) fn trap(e: wasmtime::Error) -> HostError {
    HostError::Trap(trap_reason(&e))
}

/// What happened: wasmtime's own text is a backtrace heading.
pub(crate) fn trap_reason(e: &wasmtime::Error) -> String {
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => e.root_cause().to_string(),
    }
}

pub(crate) fn load(e: wasmtime::Error) -> HostError {
    HostError::Load(e.to_string())
}

pub(crate) fn export<T, P: wasmtime::WasmParams, R: wasmtime::WasmResults>(
    instance: &Instance,
    store: &mut Store<T>,
    name: &'static str,
) -> Result<TypedFunc<P, R>, HostError> {
    instance
        .get_typed_func::<P, R>(store, name)
        .map_err(|_| HostError::MissingExport(name))
}

/// Instantiates `module` with `linker` (which has the host's imports); any
/// import the host does not define traps if called. Runs the module's
/// constructors (`_initialize`, as cdylibs for wasip1 have) and returns its
/// memory.
pub(crate) fn instantiate<T: 'static>(
    engine: &Engine,
    module: &Module,
    mut linker: Linker<T>,
    data: T,
) -> Result<(Store<T>, Instance, Memory), HostError> {
    linker
        .define_unknown_imports_as_traps(module)
        .map_err(load)?;
    let mut store = Store::new(engine, data);
    let instance = linker.instantiate(&mut store, module).map_err(load)?;
    if let Ok(init) = instance.get_typed_func::<(), ()>(&mut store, "_initialize") {
        init.call(&mut store, ()).map_err(trap)?;
    }
    let memory = instance
        .get_memory(&mut store, "memory")
        .ok_or(HostError::MissingExport("memory"))?;
    Ok((store, instance, memory))
}
