// Calls: the same steps for every protocol and transport. The core builds
// the request and reads the response; this file moves bytes, keeps time,
// and turns the core's JSON into objects and errors.

import { GrpcError, asGrpcError, localError as local, withBytes } from './errors.js';
import { CALL_OPTIONS, CLIENT_OPTIONS, JSON_OPTIONS, checkOptions } from './options.js';
import { int64ToBigInt, toJsonText } from './values.js';

/**
 * @typedef {Record<string, string | Uint8Array | Array<string | Uint8Array>>} Metadata
 *   request metadata; a key ending in -bin takes bytes
 *
 * @typedef {object} Status how a call ended
 * @property {number} code
 * @property {string} name the code's name, e.g. "OK", "NOT_FOUND"
 * @property {string} message
 * @property {object[]} details decoded google.rpc.Status details, each with its "@type"
 * @property {Record<string, string | Uint8Array>} headers
 * @property {Record<string, string | Uint8Array>} trailers
 * @property {Record<string, string | Uint8Array>} metadata headers and trailers together, trailers winning
 *
 * @typedef {object} CallOptions
 * @property {Metadata} [metadata]
 * @property {number} [timeoutMs] the deadline: sent, and kept here
 * @property {AbortSignal} [signal] aborting it cancels the call (CANCELLED)
 * @property {(status: Status) => void} [onStatus] called with the final status, OK or not
 * @property {import('./schema.js').JsonOptions} [json]
 * @property {number} [maxMessageBytes] the largest response message taken (default 4 MiB)
 * @property {'grpc-web' | 'grpc-web-text' | 'connect' | 'grpc'} [protocol]
 * @property {'proto' | 'json'} [codec] Connect's codec
 * @property {boolean} [useGet] Connect: unary calls of methods without side effects by GET
 *
 * @typedef {CallOptions & {baseUrl: string, transport?: object, fetch?: typeof fetch,
 *   credentials?: RequestCredentials, mode?: RequestMode,
 *   ca?: string | Uint8Array, cert?: string | Uint8Array, key?: string | Uint8Array,
 *   servername?: string, rejectUnauthorized?: boolean}} ClientOptions
 */

export class Client {
  #schema;
  #options;
  #transport;

  constructor(schema, givenOptions, platform) {
    const options = givenOptions ?? {};
    checkOptions('createClient', options, CLIENT_OPTIONS);
    checkOptions('createClient: options.json', options.json, JSON_OPTIONS);
    if (!options.baseUrl) throw new TypeError('createClient: options.baseUrl is required');
    this.#schema = schema;
    this.#options = { protocol: 'grpc-web', codec: 'proto', ...defined(options) };
    this.#options.baseUrl = options.baseUrl.replace(/\/+$/, '');
    this.#transport = typeof options.transport === 'object' && options.transport
      ? options.transport
      : platform.transport(this.#options);
  }

  /**
   * A unary call: resolves to the response message, or throws a GrpcError.
   * @param {string} path "/package.Service/Method"
   * @param {object} request
   * @param {CallOptions} [options]
   * @returns {Promise<any>}
   */
  async unary(path, request, options) {
    return last(this.#run(path, 'unary', request, options));
  }

  /**
   * A server-streaming call: the response messages as they arrive; throws a
   * GrpcError when the call fails.
   * @param {string} path
   * @param {object} request
   * @param {CallOptions} [options]
   * @returns {AsyncGenerator<any, Status>}
   */
  serverStream(path, request, options) {
    return this.#run(path, 'server_streaming', request, options);
  }

  /**
   * A client-streaming call from an (async) iterable of requests; needs a
   * transport that streams requests (node:http2).
   * @param {string} path
   * @param {Iterable<object> | AsyncIterable<object>} requests
   * @param {CallOptions} [options]
   * @returns {Promise<any>}
   */
  async clientStream(path, requests, options) {
    return last(this.#run(path, 'client_streaming', requests, options));
  }

  /**
   * A bidirectional call: requests from an (async) iterable, responses as
   * they arrive.
   * @param {string} path
   * @param {Iterable<object> | AsyncIterable<object>} requests
   * @param {CallOptions} [options]
   * @returns {AsyncGenerator<any, Status>}
   */
  bidiStream(path, requests, options) {
    return this.#run(path, 'bidi_streaming', requests, options);
  }

  /** Closes the transport's connections (the node:http2 transport's sessions). */
  close() {
    this.#transport.close?.();
  }

  async *#run(path, kind, input, givenCallOptions) {
    const callOptions = givenCallOptions ?? {};
    checkOptions(`client.${API[kind]}`, callOptions, CALL_OPTIONS);
    checkOptions(`client.${API[kind]}: options.json`, callOptions.json, JSON_OPTIONS);
    const options = { ...this.#options, ...defined(callOptions) };
    const json = { ...this.#options.json, ...callOptions.json };
    let call;
    try {
      checkLimit(options.maxMessageBytes);
      call = this.#schema._call(path, options.protocol, options.codec, json, options.maxMessageBytes);
    } catch (thrown) {
      throw reported(options, asGrpcError(thrown, (e) => local('INTERNAL', String(e?.message ?? e))));
    }
    const timer = { id: undefined };
    const controller = new AbortController();
    // Why the call was aborted (its deadline, or the caller's signal); every
    // wait on the transport races this, so that none outlives the abort.
    let why = null;
    let rejectAborted;
    const aborted = new Promise((_, reject) => { rejectAborted = reject; });
    aborted.catch(() => {});
    const settle = (promise) => Promise.race([promise, aborted]);
    const abort = (status) => {
      why ??= status;
      controller.abort();
      rejectAborted(new GrpcError(why));
    };
    const onUserAbort = () => abort(JSON.parse(call.localStatus('CANCELLED', cancelMessage(options.signal))));
    // Whether the response was read to its status: then there is nothing to abort.
    let ended = false;
    let body = null;
    try {
      check(call, kind, options, this.#transport);
      addMetadata(call, this.#options.metadata);
      addMetadata(call, callOptions.metadata);
      if (options.signal?.aborted) onUserAbort();
      options.signal?.addEventListener('abort', onUserAbort, { once: true });
      const timeoutMs = Number.isFinite(options.timeoutMs) && options.timeoutMs > 0 ? options.timeoutMs : undefined;
      if (timeoutMs) later(() => abort(JSON.parse(call.deadlineStatus(timeoutMs))), timeoutMs, timer);
      if (why) throw new GrpcError(why);
      const request = this.#request(call, kind, input, options, timeoutMs);
      const describe = (n) => this.#schema.describe(n);
      const output = json.bigint ? describe(call.path).output : null;
      const read = (eventsJson) => {
        const events = JSON.parse(eventsJson);
        if (output) events.messages = events.messages.map((m) => int64ToBigInt(describe, output, m));
        return events;
      };
      // A batch the core held back is pulled only while the call lives,
      // after a turn of the event loop: a chunk of many messages must let
      // the deadline's timer (and a page) run between batches.
      const pull = async () => {
        await nextTurn();
        if (why) throw new GrpcError(why);
        return read(call.pull());
      };
      const answers = { one: kind === 'unary' || kind === 'client_streaming', count: 0 };
      let status;
      try {
        const response = await settle(this.#transport.request({ ...request, signal: controller.signal }));
        // Ended by its headers: the body, if any, is left to the abort below.
        status = yield* drain(read(call.headers(response.status, response.headers)), pull, answers);
        if (!status) {
          body = response.body?.[Symbol.asyncIterator]() ?? null;
          for (;;) {
            const chunk = body ? await settle(body.next()) : { done: true };
            if (chunk.done) break;
            status = yield* drain(read(call.push(chunk.value)), pull, answers);
            if (status) break;
          }
          if (!status) {
            const trailers = await settle(response.trailers);
            status = yield* drain(read(call.finish(trailers ?? undefined)), pull, answers);
          }
          ended = true;
        }
        oneAnswer(answers, status);
      } catch (e) {
        throw failure(e, why, call);
      }
      return end(status, options);
    } catch (e) {
      throw reported(options, e);
    } finally {
      clearTimeout(timer.id);
      options.signal?.removeEventListener('abort', onUserAbort);
      // Ends the request if the caller stopped early, or the call failed.
      // (Not after a full read: an abort makes a DOMException, with its
      // stack, a fifth of a short call's time.)
      if (!ended) controller.abort();
      body?.return?.()?.catch?.(() => {});
      call.free();
    }
  }

  #request(call, kind, input, options, timeoutMs) {
    const headers = pairs(call.requestHeaders(timeoutMs));
    const url = this.#options.baseUrl + call.path;
    const streamsRequests = kind === 'client_streaming' || kind === 'bidi_streaming';
    if (streamsRequests) {
      return { url, path: call.path, method: 'POST', headers, body: encodeEach(call, input) };
    }
    const text = toJsonText(input);
    if (options.useGet && options.protocol === 'connect' && kind === 'unary') {
      const query = guarded(() => call.getQuery(text));
      // A GET has no body, so no content-type either; its query names the
      // protocol version (so that a browser needs no preflight for it).
      const getHeaders = headers.filter(([name]) => name !== 'content-type' && name !== 'connect-protocol-version');
      return { url: `${url}?${query}`, path: `${call.path}?${query}`, method: 'GET', headers: getHeaders, body: null };
    }
    const body = guarded(() => call.encodeRequest(text));
    return { url, path: call.path, method: 'POST', headers, body };
  }
}

/** The client's method for each kind of call. */
const API = { unary: 'unary', server_streaming: 'serverStream', client_streaming: 'clientStream', bidi_streaming: 'bidiStream' };

function check(call, kind, options, transport) {
  if (call.kind !== kind) {
    throw local('INVALID_ARGUMENT', `${call.path} is ${call.kind.replace('_', '-')}: call it with client.${API[call.kind]}()`);
  }
  if (options.protocol === 'grpc' && !transport.readsTrailers) {
    throw local('UNIMPLEMENTED', "protocol 'grpc' needs HTTP/2 trailers, which fetch does not expose: use gRPC-Web or Connect, or in Node the node:http2 transport");
  }
  if ((kind === 'client_streaming' || kind === 'bidi_streaming') && !transport.streamsRequests) {
    throw local('UNIMPLEMENTED', `${call.path} streams requests, which this transport cannot: fetch sends a request body whole (browsers stream none over HTTP/1.1 and half-duplex at best). In Node, use the node:http2 transport (protocol 'grpc').`);
  }
}

/** The message limit, when given: a whole number of bytes the core can hold (1 to 2^32 - 1). */
function checkLimit(limit) {
  if (limit !== undefined && !(Number.isInteger(limit) && limit > 0 && limit <= 0xffffffff)) {
    throw local('INVALID_ARGUMENT', `maxMessageBytes must be a whole number from 1 to 4294967295, not ${limit}`);
  }
}

/**
 * Yields a batch's messages, and the batches the core holds back (a chunk
 * of many messages is read about one message limit at a time); returns the
 * final status once there is one. A call that answers once stops at a
 * second message: nothing more is read.
 */
async function* drain(events, pull, answers) {
  for (;;) {
    for (const message of events.messages) {
      if (answers.one && ++answers.count > 1) throw local('INTERNAL', 'a unary response must hold one message, not more');
      yield message;
    }
    if (events.end) return events.end;
    if (!events.more) return null;
    events = await pull();
  }
}

/** A call that answers once ended OK: it must have answered. */
function oneAnswer(answers, status) {
  if (answers.one && answers.count === 0 && status.name === 'OK') {
    throw local('INTERNAL', 'a unary response must hold one message, not 0');
  }
}

/**
 * Resolves after a turn of the event loop, in which due timers and I/O
 * run: setImmediate in Node, a MessageChannel task in browsers (a chain of
 * setTimeout(0) is clamped to 4 ms, and to a second or more in hidden tabs).
 */
const nextTurn = typeof setImmediate === 'function'
  ? () => new Promise((resolve) => { setImmediate(resolve); })
  : channelTurns();

function channelTurns() {
  const channel = new MessageChannel();
  const waiting = [];
  channel.port1.onmessage = () => waiting.shift()?.();
  return () => new Promise((resolve) => {
    waiting.push(resolve);
    channel.port2.postMessage(null);
  });
}

/** setTimeout for any delay: past 2^31 - 1 ms, it would fire at once. */
function later(fn, ms, timer) {
  const MAX = 2 ** 31 - 1;
  timer.id = ms > MAX ? setTimeout(() => later(fn, ms - MAX, timer), MAX) : setTimeout(fn, ms);
}

function addMetadata(call, metadata) {
  if (!metadata) return;
  const entries = metadata instanceof Map ? [...metadata] : Object.entries(metadata);
  for (const [key, value] of entries) {
    for (const one of Array.isArray(value) ? value : [value]) {
      guarded(() => (one instanceof Uint8Array
        ? call.addBinaryMetadata(key, one)
        : call.addMetadata(key, String(one))));
    }
  }
}

async function* encodeEach(call, requests) {
  for await (const request of requests) {
    yield guarded(() => call.encodeRequest(toJsonText(request)));
  }
}

/** Runs a core operation that throws a status's JSON on bad input. */
function guarded(operation) {
  try {
    return operation();
  } catch (thrown) {
    throw asGrpcError(thrown, (e) => local('INTERNAL', String(e?.message ?? e)));
  }
}

/** The one message of a call that answers once (#run checks there is one). */
async function last(messages) {
  let result;
  for await (const message of messages) result = message;
  return result;
}

function end(status, options) {
  withBytes(status);
  status.metadata = { ...status.headers, ...status.trailers };
  options.onStatus?.(status);
  if (status.name !== 'OK') {
    const error = new GrpcError(status);
    told.add(error);
    throw error;
  }
  return status;
}

/** The errors whose call's onStatus has been told of them: once each. */
const told = new WeakSet();

/** Tells onStatus of a call that failed without a status from its peer (deadline, cancel, network, bad input). */
function reported(options, error) {
  if (error instanceof GrpcError && !told.has(error)) {
    told.add(error);
    options.onStatus?.({
      code: error.code, name: error.name, message: error.message, details: error.details,
      headers: error.headers, trailers: error.trailers, metadata: error.metadata,
    });
  }
  return error;
}

/** Why the transport failed: the deadline or cancellation that aborted it, else the network. */
function failure(error, why, call) {
  if (error instanceof GrpcError) return error;
  if (why) return new GrpcError(why);
  // An HTTP/2 stream the server reset takes the code of its error code.
  if (Number.isInteger(error?.rstCode)) return new GrpcError(JSON.parse(call.resetStatus(error.rstCode)));
  const message = `the request failed: ${error?.cause?.message ?? error?.message ?? error}`;
  return new GrpcError(JSON.parse(call.localStatus('UNAVAILABLE', message)));
}

function cancelMessage(signal) {
  const reason = signal?.reason;
  const text = reason instanceof Error ? reason.message : reason === undefined ? '' : String(reason);
  return text ? `the call was cancelled: ${text}` : 'the call was cancelled';
}

function pairs(flat) {
  const out = [];
  for (let i = 0; i + 1 < flat.length; i += 2) out.push([flat[i], flat[i + 1]]);
  return out;
}

/** The options that are set: an `undefined` value does not override a default. */
function defined(options) {
  return Object.fromEntries(Object.entries(options).filter(([, value]) => value !== undefined));
}
