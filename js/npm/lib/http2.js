// The node:http2 transport: gRPC itself (trailers and all four call kinds),
// plaintext or TLS, one session per client, reused by its calls.

import http2 from 'node:http2';

/**
 * @param {{baseUrl: string, ca?: string|Buffer, cert?: string|Buffer, key?: string|Buffer,
 *          servername?: string, rejectUnauthorized?: boolean}} options
 */
export function http2Transport(options) {
  let session = null;
  let active = 0;
  const tls = { ca: options.ca, cert: options.cert, key: options.key, servername: options.servername, rejectUnauthorized: options.rejectUnauthorized };

  function connect() {
    if (session && !session.closed && !session.destroyed) return session;
    session = http2.connect(options.baseUrl, tls);
    // A failed session fails its streams; the error is reported there.
    session.on('error', () => {});
    const mine = session;
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
    close() {
      session?.close();
      session = null;
    },
    request({ path, method, headers, body, signal }) {
      return new Promise((resolve, reject) => {
        const s = connect();
        const outgoing = { ':method': method, ':path': path };
        for (const [name, value] of headers) {
          outgoing[name] = name in outgoing ? [].concat(outgoing[name], value) : value;
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
        const trailers = new Promise((resolveTrailers) => {
          stream.on('trailers', (t) => resolveTrailers(flatten(t)));
          stream.on('close', () => resolveTrailers(null));
        });
        const onAbort = () => stream.close(http2.constants.NGHTTP2_CANCEL);
        signal.addEventListener('abort', onAbort, { once: true });
        stream.on('close', () => {
          track(-1, s);
          signal.removeEventListener('abort', onAbort);
          if (!settled) {
            settled = true;
            reject(new Error(stream.rstCode ? `the stream was reset (HTTP/2 code ${stream.rstCode})` : 'the stream closed before its response'));
          }
        });
        stream.on('error', (e) => {
          if (!settled) {
            settled = true;
            reject(e);
          }
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
        send(stream, body).catch((e) => stream.destroy(e));
      });
    },
  };
}

async function send(stream, body) {
  if (body === null) return;
  if (body instanceof Uint8Array) {
    stream.end(body);
    return;
  }
  for await (const piece of body) {
    if (!stream.write(piece)) await new Promise((r) => stream.once('drain', r));
  }
  stream.end();
}

async function* chunks(stream, signal) {
  for await (const chunk of stream) {
    yield new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  }
  if (signal.aborted) throw new Error('aborted');
  if (stream.rstCode && stream.rstCode !== http2.constants.NGHTTP2_NO_ERROR) {
    throw new Error(`the stream was reset (HTTP/2 code ${stream.rstCode})`);
  }
}

function flatten(headers) {
  const out = [];
  for (const [name, value] of Object.entries(headers)) {
    if (name.startsWith(':') && name !== ':status') continue;
    for (const one of Array.isArray(value) ? value : [value]) out.push(name, String(one));
  }
  return out;
}
