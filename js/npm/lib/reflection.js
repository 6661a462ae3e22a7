// loadFromReflection: a schema from the server's own gRPC server
// reflection. The core's loader (the Reflection class of the build) says
// what to ask and reads the answers; this file carries its rounds, one
// call each with the whole request body: gRPC over node:http2, gRPC-Web
// over fetch (through Envoy's grpc_web filter), no request streaming.

import { GrpcError, localError as local } from './errors.js';
import { CLIENT_OPTIONS, checkOptions } from './options.js';

/** loadFromReflection's own options. */
export const REFLECTION_OPTIONS = ['services', 'timeoutMs', 'signal'];

/** Rounds one load may take: the loader bounds files (1024), and each round answers at least one. */
const MAX_ROUNDS = 1100;
const DEFAULT_TIMEOUT_MS = 10000;
const SERVER_SLACK_MS = 200;

/**
 * @param {any} wasm the build (its Reflection class)
 * @param {(options: object) => object} makeTransport the platform's
 * @param {Record<string, any>} clientOptions as createClient's: baseUrl, protocol, transport...
 * @param {{services?: string[], timeoutMs?: number, signal?: AbortSignal}} load
 * @returns {Promise<Uint8Array>} the loaded FileDescriptorSet
 */
export async function reflect(wasm, makeTransport, clientOptions, load) {
  checkOptions('loadFromReflection', clientOptions, CLIENT_OPTIONS);
  checkOptions('loadFromReflection: load options', load, REFLECTION_OPTIONS);
  if (!clientOptions?.baseUrl) throw new TypeError('loadFromReflection: options.baseUrl is required');
  const services = load?.services;
  if (services !== undefined && (!Array.isArray(services) || services.length === 0
      || services.some((s) => typeof s !== 'string' || s === ''))) {
    throw new TypeError('loadFromReflection: services must be a non-empty array of service names');
  }
  /** @type {Record<string, any>} */
  const options = { protocol: 'grpc-web', ...clientOptions };
  const baseUrl = options.baseUrl.replace(/\/+$/, '');
  const transport = typeof options.transport === 'object' && options.transport ? options.transport : makeTransport(options);
  const timeoutMs = Number.isFinite(load?.timeoutMs) && load.timeoutMs > 0 ? load.timeoutMs : DEFAULT_TIMEOUT_MS;
  const deadline = Date.now() + timeoutMs;
  let reflection;
  try {
    reflection = new wasm.Reflection(services, options.protocol);
  } catch (thrown) {
    throw new GrpcError(JSON.parse(thrown));
  }
  const controller = new AbortController();
  let why = null;
  const stop = (status) => {
    why ??= status;
    controller.abort();
  };
  const timer = setTimeout(() => stop(local('DEADLINE_EXCEEDED',
    `deadline of ${timeoutMs} ms exceeded while loading through reflection`)), timeoutMs);
  const onAbort = () => stop(local('CANCELLED', 'the load was cancelled'));
  load?.signal?.addEventListener('abort', onAbort, { once: true });
  if (load?.signal?.aborted) onAbort();
  try {
    for (let round = 0; round < MAX_ROUNDS; round++) {
      const state = await oneRound(reflection, transport, baseUrl, deadline, controller.signal);
      if (state.state === 'complete') return reflection.descriptorSet();
      if (state.state === 'failed') throw new GrpcError(state.status);
    }
    throw local('RESOURCE_EXHAUSTED', `the load took more than ${MAX_ROUNDS} rounds`);
  } catch (e) {
    if (why) throw why;
    if (e instanceof GrpcError) throw e;
    throw local('UNAVAILABLE', `the reflection request failed: ${e?.cause?.message ?? e?.message ?? e}`);
  } finally {
    clearTimeout(timer);
    load?.signal?.removeEventListener('abort', onAbort);
    reflection.free();
  }
}

/** One call: the round's requests out, its answers into the loader. */
async function oneRound(reflection, transport, baseUrl, deadline, signal) {
  const body = reflection.startRound();
  const path = reflection.path;
  // The server's deadline a little after the load's own, so that the
  // load's ends it, with its own message.
  const headers = pairs(reflection.requestHeaders(Math.max(1, deadline - Date.now()) + SERVER_SLACK_MS));
  // Ends this round's call once the loader has what it needs.
  const call = new AbortController();
  const onStop = () => call.abort();
  signal.addEventListener('abort', onStop, { once: true });
  if (signal.aborted) call.abort();
  let chunks = null;
  try {
    const response = await transport.request({ url: baseUrl + path, path, method: 'POST', headers, body,
      signal: call.signal });
    let state = JSON.parse(reflection.headers(response.status, response.headers));
    chunks = response.body?.[Symbol.asyncIterator]() ?? null;
    while (state.state === 'reading' && chunks) {
      const chunk = await chunks.next();
      if (chunk.done) break;
      state = JSON.parse(reflection.push(chunk.value));
    }
    if (state.state === 'reading') {
      const trailers = await response.trailers;
      state = JSON.parse(reflection.finish(trailers ?? undefined));
    }
    return state;
  } finally {
    signal.removeEventListener('abort', onStop);
    call.abort();
    chunks?.return?.()?.catch?.(() => {});
  }
}

function pairs(flat) {
  const out = [];
  for (let i = 0; i + 1 < flat.length; i += 2) out.push([flat[i], flat[i + 1]]);
  return out;
}
