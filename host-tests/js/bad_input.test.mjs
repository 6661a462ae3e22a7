// Broken answers: a server that breaks each protocol in one way, chosen by
// the request's x-case header. Every call must end in a GrpcError with a
// clear code and message, never an uncaught exception or a hang past the
// deadline.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import http2 from 'node:http2';
import net from 'node:net';
import { gzipSync } from 'node:zlib';
import { createClient, GrpcError, Code, testSchema, TESTING, rejection } from './common.mjs';

function frame(flags, payload) {
  const body = Buffer.from(payload);
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

const WEB = { 'content-type': 'application/grpc-web+proto' };
const OK_TRAILERS = frame(0x80, 'grpc-status: 0\r\n');
// 64 frames of ~1 KiB that inflate to 1 MiB each (unknown protobuf fields).
const BOMB = Buffer.concat(Array.from({ length: 64 }, () => frame(1, gzipSync(Buffer.alloc(1 << 20, 'x')))));
// 400,000 repeats of one key, 3.2 MB: within a message's limit, far over a
// header block's. Joined by copying, this took 49 s in one wasm call.
const FLOOD = 'x-t: a\r\n'.repeat(400_000);
const CONNECT_FLOOD = JSON.stringify({ metadata: { 'x-t': Array(400_000).fill('a') } });
const CASES = {
  ok: [200, WEB, Buffer.concat([frame(0, ''), OK_TRAILERS])],
  'gzip-bomb': [200, { ...WEB, 'grpc-encoding': 'gzip' }, Buffer.concat([BOMB, OK_TRAILERS])],
  'repeated-bin': [200, { ...WEB, 'x-a-bin': ['AQI=', 'AwQ='] }, Buffer.concat([frame(0, ''), OK_TRAILERS])],
  'lf-trailers': [200, WEB, frame(0x80, 'grpc-status:7\ngrpc-message:nope\n')],
  'connect-huge-page': [503, { 'content-type': 'text/html' }, Buffer.alloc(5 << 20, '<')],
  'connect-unknown-code': [500, { 'content-type': 'application/json' }, '{"code":"brand_new","message":"a new code"}'],
  'invalid-flags': [200, WEB, frame(0x40, 'x')],
  truncated: [200, WEB, frame(0, 'abcdef').subarray(0, 8)],
  'no-trailers': [200, WEB, frame(0, '')],
  'not-protobuf': [200, WEB, Buffer.concat([frame(0, '\xff\xff\xff'), frame(0x80, 'grpc-status: 0\r\n')])],
  'over-limit': [200, WEB, Buffer.concat([frame(0, 'x'.repeat(1000)), frame(0x80, 'grpc-status: 0\r\n')])],
  'bad-base64': [200, { 'content-type': 'application/grpc-web-text' }, 'AAAA*AAA'],
  'connect-end-not-json': [200, { 'content-type': 'application/connect+proto' }, frame(2, 'not json')],
  'connect-error-not-json': [503, { 'content-type': 'text/html' }, '<h1>down</h1>'],
  'html-page': [502, { 'content-type': 'text/html' }, '<h1>bad gateway</h1>'],
  'trailers-flood': [200, WEB, Buffer.concat([frame(0, ''), frame(0x80, `grpc-status: 0\r\n${FLOOD}`)])],
  'connect-end-flood': [200, { 'content-type': 'application/connect+proto' }, frame(2, CONNECT_FLOOD)],
  'no-message': [200, WEB, OK_TRAILERS],
  'two-messages': [200, WEB, Buffer.concat([frame(0, ''), frame(0, ''), OK_TRAILERS])],
  'trailers-100': [200, WEB, Buffer.concat([frame(0, ''), frame(0x80, `grpc-status: 0\r\n${'x-t: a\r\n'.repeat(99)}`)])],
};

const server = http.createServer((request, response) => {
  const name = request.headers['x-case'];
  if (name === 'hang-before-headers') return; // never answers
  if (name === 'most-of-a-large-message') {
    // A frame that declares 4,000,000 bytes, 3,500,000 of them sent, then silence.
    const head = Buffer.alloc(5);
    head.writeUInt32BE(4_000_000, 1);
    response.writeHead(200, WEB);
    response.write(Buffer.concat([head, Buffer.alloc(3_500_000)]));
    return;
  }
  if (name === 'hang-after-headers') {
    response.writeHead(200, WEB);
    response.write(frame(0, ''));
    return; // no trailers, no end
  }
  const [status, headers, body] = CASES[name];
  response.writeHead(status, headers);
  response.end(body);
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
after(() => server.closeAllConnections() || server.close());

const schema = testSchema();
const baseUrl = `http://127.0.0.1:${server.address().port}`;
const web = createClient(schema, { baseUrl });

async function failure(name, options = {}, client = web) {
  const error = await rejection(client.unary(`${TESTING}/Sleep`, { millis: 1 }, { metadata: { 'x-case': name }, ...options }));
  assert.ok(error instanceof GrpcError, `${name}: ${error}`);
  return [error.code, error.message];
}

test('a frame with flags no protocol defines', async () => {
  assert.deepEqual(await failure('invalid-flags'), [Code.INTERNAL, 'grpc: invalid frame flags 0x40']);
});

test('a frame cut short', async () => {
  assert.deepEqual(await failure('truncated'), [Code.INTERNAL, 'grpc: stream ended inside a message (8 bytes buffered)']);
});

test('no trailers frame', async () => {
  assert.deepEqual(await failure('no-trailers'), [Code.INTERNAL, 'the gRPC-Web response ended without its trailers frame']);
});

test('a message that is not protobuf', async () => {
  const [code, message] = await failure('not-protobuf');
  assert.equal(code, Code.INTERNAL);
  assert.match(message, /^the response cannot be read: invalid grpcwasm\.testing\.SleepReply message: /);
});

test('a message over the limit', async () => {
  assert.deepEqual(await failure('over-limit', { maxMessageBytes: 100 }),
    [Code.RESOURCE_EXHAUSTED, 'grpc: received message larger than max (1000 vs. 100)']);
});

test('invalid base64 in text mode', async () => {
  const text = createClient(schema, { baseUrl, protocol: 'grpc-web-text' });
  const [code, message] = await failure('bad-base64', {}, text);
  assert.equal(code, Code.INTERNAL);
  assert.match(message, /^invalid base64 in a grpc-web-text response/);
});

test('a Connect end-of-stream message that is not JSON', async () => {
  const connect = createClient(schema, { baseUrl, protocol: 'connect' });
  const error = await rejection((async () => {
    for await (const _ of connect.serverStream(`${TESTING}/StreamThenFail`, {}, { metadata: { 'x-case': 'connect-end-not-json' } }));
  })());
  assert.equal(error.code, Code.INTERNAL);
  assert.match(error.message, /^the Connect end-of-stream message is not valid JSON: /);
});

test('a Connect error that is not JSON takes its code from the HTTP status', async () => {
  const connect = createClient(schema, { baseUrl, protocol: 'connect' });
  assert.deepEqual(await failure('connect-error-not-json', {}, connect), [Code.UNAVAILABLE, 'HTTP status 503 from a non-gRPC response']);
});

test('an HTML error page', async () => {
  assert.deepEqual(await failure('html-page'), [Code.UNAVAILABLE, 'HTTP status 502 from a non-gRPC response']);
});

for (const name of ['hang-before-headers', 'hang-after-headers']) {
  test(`the deadline ends a server that sits (${name})`, async () => {
    const started = Date.now();
    assert.deepEqual(await failure(name, { timeoutMs: 300 }), [Code.DEADLINE_EXCEEDED, 'deadline of 300 ms exceeded']);
    assert.ok(Date.now() - started < 1500, `took ${Date.now() - started} ms`);
  });
}

test('bad metadata and a bad request object are refused before anything is sent', async () => {
  const [code, message] = await failure('html-page', { metadata: { 'x-case': 'html-page', 'bad key': 'v' } });
  assert.equal(code, Code.INVALID_ARGUMENT);
  assert.match(message, /bad key/);
  const error = await rejection(web.unary(`${TESTING}/Sleep`, { millis: 'soon' }));
  assert.equal(error.code, Code.INVALID_ARGUMENT);
  assert.match(error.message, /^the request cannot be sent: millis: /);
});

test('a response of gzip frames that inflate a thousandfold is bounded', async () => {
  const before = process.memoryUsage().rss;
  // A unary call stops at the second message, the core at 4 MiB in all.
  assert.deepEqual(await failure('gzip-bomb'), [Code.INTERNAL, 'a unary response must hold one message, not more']);
  // A stream may carry them all, read a batch at a time.
  let count = 0;
  for await (const _ of web.serverStream(`${TESTING}/StreamThenFail`, {}, { metadata: { 'x-case': 'gzip-bomb' } })) count++;
  assert.equal(count, 64);
  const grown = (process.memoryUsage().rss - before) / (1 << 20);
  // Before the bound, the unary call alone took the process past 1 GB.
  assert.ok(grown < 300, `the process grew by ${grown.toFixed(0)} MiB`);
});

test('a deadline ends a stream between the batches of one chunk', async () => {
  // One chunk of 64 gzip frames is read a batch (4 MiB inflated) at a time;
  // a consumer that works 5 ms per message keeps the loop busy throughout.
  let count = 0;
  const started = Date.now();
  const error = await rejection((async () => {
    for await (const _ of web.serverStream(`${TESTING}/StreamThenFail`, {}, { timeoutMs: 20, metadata: { 'x-case': 'gzip-bomb' } })) {
      count++;
      const until = Date.now() + 5;
      while (Date.now() < until);
    }
  })());
  assert.deepEqual([error.code, error.message], [Code.DEADLINE_EXCEEDED, 'deadline of 20 ms exceeded']);
  // Before, every message of the chunk came (64, then OK), the timer never firing.
  assert.ok(count <= 16, `${count} messages, ${Date.now() - started} ms`);
});

test('onStatus hears what a unary call ends with when it answers 0 or 2 messages', async () => {
  for (const [name, message] of [['no-message', 'not 0'], ['two-messages', 'not more']]) {
    const seen = [];
    const [code, text] = await failure(name, { onStatus: (s) => seen.push([s.code, s.message]) });
    const expected = [Code.INTERNAL, `a unary response must hold one message, ${message}`];
    assert.deepEqual([code, text], expected);
    // Before, OK for the first, nothing for the second.
    assert.deepEqual(seen, [expected], name);
  }
});

test('repeated -bin metadata keeps every value', async () => {
  let status;
  await web.unary(`${TESTING}/Sleep`, { millis: 1 }, { metadata: { 'x-case': 'repeated-bin' }, onStatus: (s) => { status = s; } });
  assert.deepEqual(status.headers['x-a-bin'], [Uint8Array.from([1, 2]), Uint8Array.from([3, 4])]);
});

test('metadata past a header block ends the call at once, and a timer still fires', async () => {
  const connect = createClient(schema, { baseUrl, protocol: 'connect' });
  for (const [name, client] of [['trailers-flood', web], ['connect-end-flood', connect]]) {
    let ticks = 0;
    const timer = setInterval(() => { ticks++; }, 20);
    const started = Date.now();
    const error = await rejection((async () => {
      for await (const _ of client.serverStream(`${TESTING}/StreamThenFail`, {}, { metadata: { 'x-case': name } }));
    })());
    clearInterval(timer);
    const took = Date.now() - started;
    assert.equal(error.code, Code.RESOURCE_EXHAUSTED, `${name}: ${error.message}`);
    assert.match(error.message, /^the peer ended the call with \d+ bytes of metadata, more than 100 entries or 65536 bytes may be$|^the peer's end-of-stream message is \d+ bytes, more than 131072 may be$/);
    assert.ok(took < 2000, `${name} took ${took} ms`);
    assert.ok(ticks > 0 || took < 40, `${name}: no timer fired in ${took} ms`);
  }
  // 100 entries, grpc-status among them: the most a call may end with.
  let status;
  await web.unary(`${TESTING}/Sleep`, { millis: 1 }, { metadata: { 'x-case': 'trailers-100' }, onStatus: (s) => { status = s; } });
  assert.equal(status.trailers['x-t'].split(', ').length, 99);
});

test('trailers written with bare line feeds', async () => {
  assert.deepEqual(await failure('lf-trailers'), [Code.PERMISSION_DENIED, 'nope']);
});

test('Connect: a 5 MB error page and an unknown code', async () => {
  const connect = createClient(schema, { baseUrl, protocol: 'connect' });
  assert.deepEqual(await failure('connect-huge-page', {}, connect), [Code.UNAVAILABLE, 'HTTP status 503 from a non-gRPC response']);
  assert.deepEqual(await failure('connect-unknown-code', {}, connect), [Code.UNKNOWN, 'a new code']);
});

test('onStatus hears of failures that have no status from the peer', async () => {
  const seen = [];
  await failure('hang-before-headers', { timeoutMs: 100, onStatus: (s) => seen.push([s.code, s.message]) });
  assert.deepEqual(seen, [[Code.DEADLINE_EXCEEDED, 'deadline of 100 ms exceeded']]);
});

test('options the call cannot honour are refused at once', async () => {
  const ok = (options) => web.unary(`${TESTING}/Sleep`, { millis: 1 }, { metadata: { 'x-case': 'ok' }, ...options });
  // Deadlines past setTimeout's range, and none at all.
  assert.deepEqual(await ok({ timeoutMs: Infinity }), {});
  assert.deepEqual(await ok({ timeoutMs: 30 * 24 * 3600 * 1000 }), {});
  let error = await rejection(ok({ maxMessageBytes: -1 }));
  assert.deepEqual([error.code, error.message], [Code.INVALID_ARGUMENT, 'maxMessageBytes must be a whole number from 1 to 4294967295, not -1']);
  error = await rejection(ok({ protocol: 'grpc' }));
  assert.equal(error.code, Code.UNIMPLEMENTED);
  assert.match(error.message, /^protocol 'grpc' needs HTTP\/2 trailers/);
  error = await rejection(ok({ metadata: { 'connect-timeout-ms': '5' } }));
  assert.deepEqual([error.code, error.message], [Code.INVALID_ARGUMENT, "metadata key 'connect-timeout-ms' is a header the protocol sets itself"]);
  // Node's Buffer is bytes too.
  assert.deepEqual(schema.encode('grpcwasm.testing.LargeReply', { payload: Buffer.from('hi') }),
    schema.encode('grpcwasm.testing.LargeReply', { payload: new Uint8Array([104, 105]) }));
});

// gRPC over node:http2 against a server that misbehaves at the HTTP/2 level.
const h2 = http2.createServer();
h2.on('stream', (stream, headers) => {
  // A stream closed with an error code errors on this side too.
  stream.on('error', () => {});
  const grpc = { ':status': 200, 'content-type': 'application/grpc' };
  switch (headers['x-case']) {
    case 'refuse':
      stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
      break;
    case 'deny-without-reading':
      stream.respond({ ...grpc, 'grpc-status': '7', 'grpc-message': 'no' }, { endStream: true });
      break;
    default:
      stream.respond(grpc, { waitForTrailers: true });
      stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0', 'x-path': headers[':path'] }));
      stream.end(frame(0, ''));
  }
});
await new Promise((resolve) => h2.listen(0, '127.0.0.1', resolve));
// A TCP server that accepts and never speaks: a TLS handshake waits forever.
const sockets = [];
const silent = net.createServer((socket) => sockets.push(socket));
await new Promise((resolve) => silent.listen(0, '127.0.0.1', resolve));
after(() => {
  h2.close();
  silent.close();
  for (const socket of sockets) socket.destroy();
});
const native = createClient(schema, { baseUrl: `http://127.0.0.1:${h2.address().port}/prefix`, protocol: 'grpc' });
after(() => native.close());

test('node:http2: the server refuses the stream', async () => {
  assert.deepEqual(await failure('refuse', {}, native), [Code.UNAVAILABLE, 'the server reset the stream with REFUSED_STREAM']);
});

test('node:http2: a base URL with a path prefixes the method', async () => {
  let status;
  await native.unary(`${TESTING}/Sleep`, { millis: 1 }, { onStatus: (s) => { status = s; } });
  assert.equal(status.trailers['x-path'], `/prefix${TESTING}/Sleep`);
});

test('node:http2: the deadline and the signal end a call whose connection never opens', async () => {
  const stuck = createClient(schema, { baseUrl: `https://127.0.0.1:${silent.address().port}`, protocol: 'grpc' });
  let started = Date.now();
  let error = await rejection(stuck.unary(`${TESTING}/Sleep`, { millis: 1 }, { timeoutMs: 300 }));
  assert.deepEqual([error.code, error.message], [Code.DEADLINE_EXCEEDED, 'deadline of 300 ms exceeded']);
  assert.ok(Date.now() - started < 1500, `took ${Date.now() - started} ms`);
  started = Date.now();
  error = await rejection(stuck.unary(`${TESTING}/Sleep`, { millis: 1 }, { signal: AbortSignal.timeout(200) }));
  assert.equal(error.code, Code.CANCELLED);
  assert.ok(Date.now() - started < 1500, `took ${Date.now() - started} ms`);
  stuck.close();
});

test('node:http2: a server that answers without reading ends the requests too', async () => {
  let closed = false;
  async function* forever() {
    try {
      for (let i = 0; ; i++) yield { location: { latitude: i, longitude: i }, message: 'x'.repeat(1000) };
    } finally {
      closed = true;
    }
  }
  const error = await rejection((async () => {
    for await (const _ of native.bidiStream('/routeguide.RouteGuide/RouteChat', forever(), { metadata: { 'x-case': 'deny-without-reading' } }));
  })());
  assert.deepEqual([error.code, error.message], [Code.PERMISSION_DENIED, 'no']);
  const started = Date.now();
  while (!closed && Date.now() - started < 2000) await new Promise((r) => setTimeout(r, 20));
  assert.ok(closed, "the caller's request iterable was never closed");
});

test('calls that each hold most of a large message share one budget', async () => {
  // 40 such calls would hold 160 MiB; the module's calls hold 128 MiB at most together.
  const calls = Array.from({ length: 40 }, () => failure('most-of-a-large-message', { timeoutMs: 3000 }));
  const outcomes = await Promise.all(calls);
  const refused = outcomes.filter(([code]) => code === Code.RESOURCE_EXHAUSTED);
  assert.ok(refused.length >= 4, JSON.stringify(outcomes.map(([code]) => code)));
  for (const [, message] of refused) {
    assert.match(message, /^the module holds too many responses at once: \d+ bytes for other calls, the limit is 134217728$/);
  }
  assert.ok(outcomes.every(([code]) => code === Code.RESOURCE_EXHAUSTED || code === Code.DEADLINE_EXCEEDED));
  // Ended calls give their share back.
  assert.deepEqual(await web.unary(`${TESTING}/Sleep`, { millis: 1 }, { metadata: { 'x-case': 'ok' } }), {});
});
