//! What a plugin configuration brings: a binary `FileDescriptorSet`, `.proto`
//! sources, or the whole configuration JSON. Each loads or fails with an
//! error; what loads can be listed and written out as a descriptor set that
//! loads again.
//!
//! Input: `[mode]` then the bytes: mode 0 a descriptor set, 1 a `.proto`
//! file, 2 the filter's JSON configuration.

#![no_main]

use grpc_wasm::http_rule::bindings_of;
use grpc_wasm::proxy::config::FilterConfig;
use grpc_wasm_fuzz::{fresh_registry, header, on_host_stack};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| on_host_stack(data, run));

fn run(data: &[u8]) {
    let Some(([mode], bytes)) = header::<1>(data) else {
        return;
    };
    let mut registry = fresh_registry();
    let loaded = match mode % 3 {
        0 => registry.add_descriptor_set(bytes).is_ok(),
        1 => {
            let text = String::from_utf8_lossy(bytes);
            registry
                .add_sources([("input.proto", text.as_ref())])
                .is_ok()
        }
        _ => {
            let _ = FilterConfig::load(bytes);
            false
        }
    };
    if !loaded {
        return;
    }
    for method in registry.methods_by_path().values() {
        let _ = bindings_of(method);
    }
    let set = registry.encode_descriptor_set();
    let mut again = fresh_registry();
    if let Err(e) = again.add_descriptor_set(&set) {
        panic!("a loaded registry's own descriptor set does not load: {e}");
    }
}
