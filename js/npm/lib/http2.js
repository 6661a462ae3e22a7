// The node:http2 transport: gRPC itself (trailers and all four call kinds),
// plaintext or TLS, one session per client, reused by its calls.

import http2 from 'node:http2';
import { HTTP2_OPTIONS, checkOptions } from './options.js';

const { NGHTTP2_NO_ERROR } = http2.constants;

// Sessions whose TCP (or TLS) connection was made, and those whose server
// then sent its SETTINGS, as HTTP/2 makes every server do first; and the
// error a session failed with.
const connected = new WeakSet();
const heard = new WeakSet();
const sessionErrors = new WeakMap();

/**
 * @param {{baseUrl: string, ca?: string|Buffer, cert?: string|Buffer, key?: string|Buffer,
 *          servername?: string, rejectUnauthorized?: boolean}} options
 */
export function http2Transport(options) {
  checkOptions('http2Transport', options, HTTP2_OPTIONS);
  let session = null;
  let active = 0;
  const tls = { ca: options.ca, cert: options.cert, key: options.key, servername: options.servername, rejectUnauthorized: options.rejectUnauthorized };
  // A base URL's path, as fetch keeps it: https://host/api + /pkg.Svc/M.
  const url = new URL(options.baseUrl);
  const prefix = url.pathname.replace(/\/+$/, '');
  const plaintext = url.protocol === 'http:';

  function connect() {
    if (session && !session.closed && !session.destroyed) return session;
    session = http2.connect(options.baseUrl, tls);
    const mine = session;
    // A failed session fails its streams; the error is reported there.
    mine.on('error', (e) => sessionErrors.set(mine, e));
    mine.once('connect', () => connected.add(mine));
    mine.once('remoteSettings', () => heard.add(mine));
    session.on('close', () => {
      if (session === mine) session = null;
    });
    return session;
  }

  // An idle session does not keep Node running; a call in flight does.
  function track(delta, s) {
    active += delta;
    if (active > 0) s.ref();
    else s.unref();
  }

  return {
    streamsRequests: true,
    readsTrailers: true,
    close() {
      session?.close();
      session = null;
    },
    request({ path, method, headers, body, signal }) {
      return new Promise((resolve, reject) => {
        const s = connect();
        // No prototype: a metadata key `__proto__` is a header like any other.
        const outgoing = Object.assign(Object.create(null), { ':method': method, ':path': prefix + path });
        for (const [name, value] of headers) {
          outgoing[name] = Object.hasOwn(outgoing, name) ? [].concat(outgoing[name], value) : value;
        }
        let stream;
        try {
          stream = s.request(outgoing, { endStream: body === null });
        } catch (e) {
          reject(e);
          return;
        }
        track(1, s);
        let settled = false;
        const fail = (error) => {
          if (settled) return;
          settled = true;
          reject(error);
        };
        const trailers = new Promise((resolveTrailers, rejectTrailers) => {
          let received = false;
          stream.on('trailers', (t) => {
            received = true;
            resolveTrailers(flatten(t));
          });
          stream.on('close', () => {
            if (!received && reset(stream, signal)) rejectTrailers(resetError(stream));
            else resolveTrailers(null);
          });
        });
        trailers.catch(() => {});
        const onAbort = () => {
          fail(new Error('aborted'));
          // Destroyed (RST_STREAM CANCEL), not closed: a close waits for the
          // stream to be ready and for its unsent data to drain, which a
          // stalled connection or a server that stops reading never allows.
          stream.destroy();
        };
        signal.addEventListener('abort', onAbort, { once: true });
        // A request body that failed here is this side's error, never the server's.
        let bodyFailed = null;
        stream.on('close', () => {
          track(-1, s);
          signal.removeEventListener('abort', onAbort);
          if (bodyFailed) fail(bodyFailed);
          else if (unheard(s)) fail(unheardError(s, plaintext));
          else fail(reset(stream, signal) ? resetError(stream) : new Error('the stream closed before its response'));
        });
        stream.on('error', (e) => {
          if (bodyFailed) fail(bodyFailed);
          else if (unheard(s)) fail(unheardError(s, plaintext, e));
          else fail(reset(stream, signal, e) ? resetError(stream) : e);
        });
        stream.on('response', (responseHeaders) => {
          settled = true;
          resolve({
            status: Number(responseHeaders[':status']),
            headers: flatten(responseHeaders),
            body: chunks(stream, signal),
            trailers,
          });
        });
        send(stream, body).catch((e) => {
          bodyFailed = e;
          stream.destroy(e);
        });
      });
    },
  };
}

/** A connection made whose server never spoke HTTP/2 (its SETTINGS never came). */
function unheard(session) {
  return connected.has(session) && !heard.has(session);
}

/**
 * The failure of a connection whose server never spoke HTTP/2: no stream
 * of it reached a server, so it is not the server's reset. In plaintext
 * that is what a TLS server does (it reads the HTTP/2 preface as a bad
 * TLS record, and answers with an alert or closes).
 */
function unheardError(session, plaintext, error) {
  // Node fails a session's streams before it reports the session's error.
  const cause = sessionErrors.get(session)?.message ?? error?.message ?? 'the server closed it';
  const hint = plaintext ? ' (does the server want TLS? use an https:// baseUrl, with ca for a private CA)' : '';
  return new Error(`the connection failed before the server spoke HTTP/2: ${cause}${hint}`);
}

/**
 * Whether the server reset the stream: not this side's abort, and not a
 * connection that failed (a stream still pending never reached the server).
 */
function reset(stream, signal, error) {
  if (error && error.code !== 'ERR_HTTP2_STREAM_ERROR') return false;
  return !signal.aborted && !stream.pending && Number.isInteger(stream.rstCode) && stream.rstCode !== NGHTTP2_NO_ERROR;
}

function resetError(stream) {
  return Object.assign(new Error(`the stream was reset (HTTP/2 error code ${stream.rstCode})`), { rstCode: stream.rstCode });
}

/**
 * Writes the request body: bytes, or the pieces of an (async) iterable as
 * they come, waiting while the stream is full. A stream that closes ends
 * the writing, and the caller's iterable is closed in every case.
 */
async function send(stream, body) {
  if (body === null) return;
  if (body instanceof Uint8Array) {
    stream.end(body);
    return;
  }
  const pieces = body[Symbol.asyncIterator]();
  try {
    for (;;) {
      const { done, value } = await pieces.next();
      if (done || stream.destroyed || stream.closed) break;
      if (!stream.write(value)) await writable(stream);
    }
    if (!stream.destroyed && !stream.closed) stream.end();
  } finally {
    await pieces.return?.();
  }
}

/**
 * Resolves when the stream drains, or can take no more writes.
 * @returns {Promise<void>}
 */
function writable(stream) {
  return new Promise((/** @type {() => void} */ resolve) => {
    if (stream.destroyed || stream.closed) {
      resolve();
      return;
    }
    const done = () => {
      stream.off('drain', done);
      stream.off('close', done);
      stream.off('error', done);
      resolve();
    };
    stream.on('drain', done);
    stream.on('close', done);
    stream.on('error', done);
  });
}

async function* chunks(stream, signal) {
  try {
    for await (const chunk of stream) {
      yield new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    }
  } catch (e) {
    throw reset(stream, signal, e) ? resetError(stream) : e;
  }
  if (signal.aborted) throw new Error('aborted');
}

function flatten(headers) {
  const out = [];
  for (const [name, value] of Object.entries(headers)) {
    if (name.startsWith(':') && name !== ':status') continue;
    for (const one of Array.isArray(value) ? value : [value]) out.push(name, String(one));
  }
  return out;
}
