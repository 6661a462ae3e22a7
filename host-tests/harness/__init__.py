"""What the Python host tests share: the processes they run (Envoy, nginx,
ngx_wasm_module, the test servers, grpcio's interop server, the
lua-resty-ffi harness), the clients they speak with (raw HTTP/2), the
readers of what those say (Prometheus text, logs), and where things are
(`paths`). Tests import `harness.<module>`; pytest and the Makefile put
host-tests on the path, and nothing else."""
