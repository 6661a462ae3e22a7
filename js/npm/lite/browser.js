// grpc-wasm for browsers (and any runtime with fetch): the lite build: descriptor
// sets only, no .proto compiler.
import init, * as wasm from '../wasm/lite/grpc_wasm.js';
import { makeApi } from '../lib/api.js';
import { fetchTransport } from '../lib/fetch.js';
import { FETCH_OPTIONS, pick } from '../lib/options.js';

await init({ module_or_path: new URL('../wasm/lite/grpc_wasm_bg.wasm', import.meta.url) });

export const { Code, GrpcError, hasCompiler, loadProto, loadDescriptorSet, loadFromReflection, createClient } = makeApi(wasm, {
  transport: (options) => fetchTransport(pick(options, FETCH_OPTIONS)),
});
export { fetchTransport };
export * from '../lib/types.js';
