// The package's API over one wasm-bindgen build (full or lite): schemas and
// clients. The entry points (browser.js, node.js, lite/*) load the build
// and pass it here with their platform's transports.

import { GrpcError, useCodeNames } from './errors.js';
import { Client } from './client.js';
import { JSON_OPTIONS, checkOptions } from './options.js';
import { Schema } from './schema.js';
import { reflect } from './reflection.js';

/**
 * What this file calls of a wasm-bindgen build (js/src/lib.rs).
 * @typedef {object} WasmBuild
 * @property {() => string[]} codeNames
 * @property {(emitDefaults: boolean, enumsAsNumbers: boolean, protoFieldNames: boolean,
 *             ignoreUnknownFields: boolean) => number} jsonOptions
 * @property {{new (): object, hasCompiler(): boolean}} Schema
 * @property {new (services: string[] | undefined, protocol: string) => object} Reflection
 */

/**
 * @param {WasmBuild} wasm the initialised wasm-bindgen module
 * @param {{transport: (options: Record<string, any>) => object}} platform
 */
export function makeApi(wasm, platform) {
  const names = wasm.codeNames();
  useCodeNames(names);
  /** @type {Readonly<Record<string, number>>} gRPC codes by name: Code.NOT_FOUND === 5 */
  const Code = Object.freeze(Object.fromEntries(names.map((name, i) => [name, i])));

  /** Options for JSON: the core's bit set, and whether int64 reads as BigInt. */
  function jsonBits(options = {}) {
    checkOptions('JSON options', options, JSON_OPTIONS);
    return wasm.jsonOptions(
      !!options.emitDefaults,
      !!options.enumsAsNumbers,
      !!options.protoFieldNames,
      !!options.ignoreUnknownFields,
    );
  }

  /**
   * Compiles `.proto` files; imports resolve among them, and google/protobuf,
   * google/api and google/rpc are bundled. Throws an Error naming the file,
   * line and column of the first problem.
   * @param {Record<string, string>} files name → source
   * @returns {Schema}
   */
  function loadProto(files) {
    return new Schema(new wasm.Schema(), jsonBits).addProto(files);
  }

  /**
   * Loads a binary FileDescriptorSet (`protoc --include_imports
   * --descriptor_set_out`, `buf build -o x.binpb`).
   * @param {Uint8Array} bytes
   * @returns {Schema}
   */
  function loadDescriptorSet(bytes) {
    return new Schema(new wasm.Schema(), jsonBits).addDescriptorSet(bytes);
  }

  /**
   * A schema of what the server at `options.baseUrl` says it serves,
   * through gRPC server reflection (`grpc.reflection.v1`, else `v1alpha`),
   * with every file its services import: no .proto file or descriptor set
   * needed. `options` are createClient's (protocol 'grpc' over node:http2
   * in Node; 'grpc-web' over fetch, through a proxy such as Envoy's
   * grpc_web filter that routes `/grpc.reflection.` to the server).
   * Rejects with a GrpcError: UNIMPLEMENTED for a server without
   * reflection, the server's own code for a service it does not know.
   * @param {import('./client.js').ClientOptions} options
   * @param {{services?: string[], timeoutMs?: number, signal?: AbortSignal}} [load]
   *   services: only these (default every service listed); timeoutMs: the whole load (default 10000)
   * @returns {Promise<Schema>}
   */
  async function loadFromReflection(options, load) {
    const set = await reflect(wasm, platform.transport, options, load);
    return loadDescriptorSet(set);
  }

  /**
   * A client for the services of `schema` at `options.baseUrl`.
   * @param {Schema} schema
   * @param {import('./client.js').ClientOptions} options
   * @returns {Client}
   */
  function createClient(schema, options) {
    return new Client(schema, options, platform);
  }

  return {
    Code,
    GrpcError,
    /** @type {boolean} whether this build compiles .proto files (the lite build does not) */
    hasCompiler: wasm.Schema.hasCompiler(),
    loadProto,
    loadDescriptorSet,
    loadFromReflection,
    createClient,
  };
}
