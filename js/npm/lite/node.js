// grpc-wasm for Node, lite build (descriptor sets only); fetch for gRPC-Web and Connect, and
// node:http2 for gRPC itself (protocol 'grpc').
import { readFile } from 'node:fs/promises';
import { initSync } from '../wasm/lite/grpc_wasm.js';
import * as wasm from '../wasm/lite/grpc_wasm.js';
import { makeApi } from '../lib/api.js';
import { fetchTransport } from '../lib/fetch.js';
import { http2Transport } from '../lib/http2.js';

initSync({ module: await readFile(new URL('../wasm/lite/grpc_wasm_bg.wasm', import.meta.url)) });

export const { Code, GrpcError, hasCompiler, loadProto, loadDescriptorSet, createClient } = makeApi(wasm, {
  transport: (options) => (options.protocol === 'grpc' ? http2Transport(options) : fetchTransport(options)),
});
export { fetchTransport, http2Transport };
