// Native gRPC over node:http2 to the tonic servers, no proxy: all four
// call kinds, trailers, and TLS.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createClient, Code, GrpcError, testSchema, TESTING, rejection } from './common.mjs';

const schema = testSchema();
const testing = createClient(schema, { baseUrl: process.env.TESTING_URL, protocol: 'grpc' });
const routes = createClient(schema, { baseUrl: process.env.ROUTEGUIDE_URL, protocol: 'grpc' });
const tls = createClient(schema, {
  baseUrl: process.env.ECHO_TLS_URL,
  protocol: 'grpc',
  ca: readFileSync(process.env.CA_PEM),
});

test.after(() => {
  testing.close();
  routes.close();
  tls.close();
});

test('unary, with the status and its metadata from the trailers', async () => {
  let status;
  const reply = await testing.unary(`${TESTING}/EchoMetadata`, {}, {
    metadata: { 'x-echo-one': 'v1', 'x-bytes-bin': new Uint8Array([0, 255]) },
    onStatus: (s) => { status = s; },
  });
  assert.equal(reply.metadata['x-echo-one'], 'v1');
  assert.equal(status.headers['x-echo-one'], 'v1');
  assert.equal(status.trailers['x-echo-one-trailer'], 'v1');
});

test('server streaming, then an error with details from the trailers', async () => {
  const points = [];
  for await (const feature of routes.serverStream('/routeguide.RouteGuide/ListFeatures', {
    lo: { latitude: 400000000, longitude: -750000000 },
    hi: { latitude: 420000000, longitude: -730000000 },
  })) {
    points.push(feature.location);
  }
  assert.ok(points.length > 10, `${points.length} features`);
  const error = await rejection(testing.unary(`${TESTING}/Fail`, { code: 7, message: 'no', withDetails: true }));
  assert.ok(error instanceof GrpcError);
  assert.deepEqual([error.code, error.name, error.details.length], [Code.PERMISSION_DENIED, 'PERMISSION_DENIED', 2]);
});

test('client streaming', async () => {
  async function* points() {
    yield { latitude: 409146138, longitude: -746188906 };
    yield { latitude: 410248224, longitude: -747127767 };
  }
  const summary = await routes.clientStream('/routeguide.RouteGuide/RecordRoute', points());
  assert.equal(summary.pointCount, 2);
});

test('bidirectional streaming', async () => {
  const notes = [1, 2, 3].map((i) => ({ location: { latitude: 1, longitude: 1 }, message: `note ${i}` }));
  const seen = [];
  for await (const note of routes.bidiStream('/routeguide.RouteGuide/RouteChat', notes)) seen.push(note.message);
  // Each note sent is answered with the earlier notes at the same place.
  assert.deepEqual(seen, ['note 1', 'note 1', 'note 2']);
});

test('TLS: all four kinds against the echo server', async () => {
  const echo = '/grpc.examples.echo.Echo';
  assert.deepEqual(await tls.unary(`${echo}/UnaryEcho`, { message: 'hi' }), { message: 'hi' });
  const streamed = [];
  for await (const r of tls.serverStream(`${echo}/ServerStreamingEcho`, { message: 's' })) streamed.push(r.message);
  assert.ok(streamed.length >= 1);
  const summed = await tls.clientStream(`${echo}/ClientStreamingEcho`, [{ message: 'a' }, { message: 'b' }]);
  assert.equal(typeof summed.message, 'string');
  const bidi = [];
  for await (const r of tls.bidiStream(`${echo}/BidirectionalStreamingEcho`, [{ message: 'x' }, { message: 'y' }])) bidi.push(r.message);
  assert.equal(bidi.length, 2);
});

test('the deadline ends a call the server sits on', async () => {
  const started = Date.now();
  const error = await rejection(testing.unary(`${TESTING}/Sleep`, { millis: 5000 }, { timeoutMs: 200 }));
  assert.equal(error.code, Code.DEADLINE_EXCEEDED);
  assert.ok(Date.now() - started < 2000);
});

test('plaintext to a TLS server is UNAVAILABLE, with a hint at TLS', async () => {
  const plain = createClient(schema, { baseUrl: process.env.ECHO_TLS_URL.replace(/^https:/, 'http:'), protocol: 'grpc' });
  const error = await rejection(plain.unary('/grpc.examples.echo.Echo/UnaryEcho', { message: 'hi' }, { timeoutMs: 5000 }));
  plain.close();
  assert.equal(error.code, Code.UNAVAILABLE, error.message);
  assert.match(error.message, /^the request failed: the connection failed before the server spoke HTTP\/2: .*\(does the server want TLS\? use an https:\/\/ baseUrl, with ca for a private CA\)$/);
});

test('a refused connection is UNAVAILABLE', async () => {
  const nowhere = createClient(schema, { baseUrl: 'http://127.0.0.1:1', protocol: 'grpc' });
  const error = await rejection(nowhere.unary(`${TESTING}/Sleep`, { millis: 1 }));
  assert.equal(error.code, Code.UNAVAILABLE);
  assert.match(error.message, /^the request failed: .*ECONNREFUSED/);
  nowhere.close();
});
