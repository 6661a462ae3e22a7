// Broken answers: a server that breaks each protocol in one way, chosen by
// the request's x-case header. Every call must end in a GrpcError with a
// clear code and message, never an uncaught exception or a hang past the
// deadline.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { createClient, GrpcError, Code, testSchema, TESTING, rejection } from './common.mjs';

function frame(flags, payload) {
  const body = Buffer.from(payload);
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

const WEB = { 'content-type': 'application/grpc-web+proto' };
const CASES = {
  'invalid-flags': [200, WEB, frame(0x40, 'x')],
  truncated: [200, WEB, frame(0, 'abcdef').subarray(0, 8)],
  'no-trailers': [200, WEB, frame(0, '')],
  'not-protobuf': [200, WEB, Buffer.concat([frame(0, '\xff\xff\xff'), frame(0x80, 'grpc-status: 0\r\n')])],
  'over-limit': [200, WEB, Buffer.concat([frame(0, 'x'.repeat(1000)), frame(0x80, 'grpc-status: 0\r\n')])],
  'bad-base64': [200, { 'content-type': 'application/grpc-web-text' }, 'AAAA*AAA'],
  'connect-end-not-json': [200, { 'content-type': 'application/connect+proto' }, frame(2, 'not json')],
  'connect-error-not-json': [503, { 'content-type': 'text/html' }, '<h1>down</h1>'],
  'html-page': [502, { 'content-type': 'text/html' }, '<h1>bad gateway</h1>'],
};

const server = http.createServer((request, response) => {
  const name = request.headers['x-case'];
  if (name === 'hang-before-headers') return; // never answers
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
