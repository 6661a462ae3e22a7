// grpc-wasm for Node: the full build; fetch for gRPC-Web and Connect, and
// node:http2 for gRPC itself (protocol 'grpc').
import { readFile } from 'node:fs/promises';
import { initSync } from './wasm/full/grpc_wasm.js';
import * as wasm from './wasm/full/grpc_wasm.js';
import { makeApi } from './lib/api.js';
import { fetchTransport } from './lib/fetch.js';
import { FETCH_OPTIONS, HTTP2_OPTIONS, pick } from './lib/options.js';
import { http2Transport } from './lib/http2.js';

initSync({ module: await readFile(new URL('./wasm/full/grpc_wasm_bg.wasm', import.meta.url)) });

export const { Code, GrpcError, hasCompiler, loadProto, loadDescriptorSet, loadFromReflection, createClient } = makeApi(wasm, {
  transport: (options) => (options.protocol === 'grpc'
    ? http2Transport(pick(options, HTTP2_OPTIONS))
    : fetchTransport(pick(options, FETCH_OPTIONS))),
});
export { fetchTransport, http2Transport };
export * from './lib/types.js';
