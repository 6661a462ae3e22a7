;; The least a proxy-wasm HTTP filter can be: every HTTP callback exported,
;; each returning Continue at once. Envoy's instructions per request with it,
;; over plain gRPC without it, are what any wasm filter costs before doing
;; anything (count_instructions.py). Assembled by binaryen's wasm-as.
(module
  (memory (export "memory") 2)
  (global $next (mut i32) (i32.const 1024))
  (func (export "proxy_abi_version_0_2_1"))
  ;; A bump allocator: the host hands over configuration once.
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32)
    (local $at i32)
    (local.set $at (global.get $next))
    (global.set $next (i32.add (global.get $next) (i32.and (i32.add (local.get $size) (i32.const 15)) (i32.const -16))))
    (local.get $at))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_request_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_request_trailers") (param i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_trailers") (param i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "proxy_on_log") (param i32))
  (func (export "proxy_on_delete") (param i32)))
