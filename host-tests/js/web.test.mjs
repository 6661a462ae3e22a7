// gRPC-Web and Connect calls against two stacks we did not write: Envoy's
// own grpc_web + cors + connect_grpc_bridge filters in front of the tonic
// test servers (both gRPC-Web content types, Connect with protobuf), and
// Connect's own Node server (gRPC-Web, Connect with protobuf and JSON:
// Envoy's bridge passes JSON to an upstream that must speak
// application/grpc+json, which tonic does not).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createClient, fetchTransport, GrpcError, Code, testSchema, TESTING, rejection } from './common.mjs';

const ENVOY = process.env.ENVOY_URL;
const CONNECT = process.env.CONNECT_URL;
const schema = testSchema();
// Envoy's connect_grpc_bridge copies grpc-message into the Connect error
// still percent-encoded (as gRPC's header carries it), where Connect's
// messages are plain text: a difference of Envoy's, listed in the README.
const percentEncoded = (text) => encodeURIComponent(text);
const plain = (text) => text;
const VARIANTS = [
  { via: 'envoy', baseUrl: ENVOY, protocol: 'grpc-web', message: plain },
  { via: 'envoy', baseUrl: ENVOY, protocol: 'grpc-web-text', message: plain },
  { via: 'envoy', baseUrl: ENVOY, protocol: 'connect', codec: 'proto', message: percentEncoded },
  { via: 'connect-node', baseUrl: CONNECT, protocol: 'grpc-web', message: plain },
  { via: 'connect-node', baseUrl: CONNECT, protocol: 'connect', codec: 'proto', message: plain },
  { via: 'connect-node', baseUrl: CONNECT, protocol: 'connect', codec: 'json', message: plain },
];

for (const variant of VARIANTS) {
  const label = `${variant.via} ${variant.protocol}${variant.codec ? `/${variant.codec}` : ''}`;
  const client = createClient(schema, { baseUrl: variant.baseUrl, protocol: variant.protocol, codec: variant.codec });

  test(`${label}: unary`, async () => {
    const reply = await client.unary('/helloworld.Greeter/SayHello', { name: 'Ada' });
    assert.deepEqual(reply, { message: 'Hello Ada!' });
  });

  test(`${label}: server streaming yields each message as it arrives`, async () => {
    const started = Date.now();
    const seen = [];
    for await (const item of client.serverStream(`${TESTING}/StreamThenFail`, { count: 3, intervalMillis: 400 })) {
      seen.push([item, Date.now() - started]);
    }
    const ended = Date.now() - started;
    assert.deepEqual(seen.map(([item]) => item), [{}, { index: 1 }, { index: 2 }]);
    // The first item came ~800 ms before the end: not buffered to the end.
    assert.ok(seen[0][1] < ended - 500, `first item at ${seen[0][1]} ms, end at ${ended} ms`);
  });

  test(`${label}: a stream that ends in an error`, async () => {
    const items = [];
    const error = await rejection((async () => {
      for await (const item of client.serverStream(`${TESTING}/StreamThenFail`, { count: 2, code: 9, message: 'stop here' })) {
        items.push(item);
      }
    })());
    assert.equal(items.length, 2);
    assert.ok(error instanceof GrpcError);
    assert.deepEqual([error.code, error.name, error.message], [9, 'FAILED_PRECONDITION', variant.message('stop here')]);
  });

  test(`${label}: an error with details`, async () => {
    const error = await rejection(client.unary(`${TESTING}/Fail`, { code: 5, message: 'no such shelf', withDetails: true }));
    assert.ok(error instanceof GrpcError);
    assert.deepEqual([error.code, error.name, error.message], [Code.NOT_FOUND, 'NOT_FOUND', variant.message('no such shelf')]);
    assert.deepEqual(error.details, [
      { '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: 'TEST_FAILURE', domain: 'grpc-wasm.test', metadata: { requested_code: '5' } },
      { '@type': 'type.googleapis.com/google.rpc.BadRequest', fieldViolations: [{ field: 'code', description: 'requested failure' }] },
    ]);
  });

  test(`${label}: the deadline is sent and kept`, async () => {
    const started = Date.now();
    const error = await rejection(client.unary(`${TESTING}/Sleep`, { millis: 5000 }, { timeoutMs: 300 }));
    assert.equal(error.code, Code.DEADLINE_EXCEEDED, error.message);
    assert.ok(Date.now() - started < 2000, `took ${Date.now() - started} ms`);
  });

  test(`${label}: metadata both ways`, async () => {
    let status;
    const reply = await client.unary(`${TESTING}/EchoMetadata`, {}, {
      metadata: { 'x-who': 'me', 'x-echo-one': 'v1' },
      onStatus: (s) => { status = s; },
    });
    assert.equal(reply.metadata['x-who'], 'me');
    assert.equal(status.code, 0);
    assert.equal(status.headers['x-echo-one'], 'v1');
    assert.equal(status.trailers['x-echo-one-trailer'], 'v1');
  });

  test(`${label}: abort cancels a stream`, async () => {
    const controller = new AbortController();
    const items = [];
    const error = await rejection((async () => {
      for await (const item of client.serverStream(`${TESTING}/StreamThenFail`, { count: 50, intervalMillis: 100 }, { signal: controller.signal })) {
        items.push(item);
        if (items.length === 2) controller.abort('enough');
      }
    })());
    assert.equal(items.length, 2);
    assert.deepEqual([error.code, error.message], [Code.CANCELLED, 'the call was cancelled: enough']);
  });

  test(`${label}: client streaming over fetch fails at once`, async () => {
    const error = await rejection(client.clientStream('/grpc.examples.echo.Echo/ClientStreamingEcho', [{ message: 'a' }]));
    assert.equal(error.code, Code.UNIMPLEMENTED);
    assert.match(error.message, /streams requests, which this transport cannot/);
  });
}

test('connect: unary by GET for a method without side effects', async () => {
  const methods = [];
  const recording = (url, init) => {
    methods.push(init.method);
    return fetch(url, init);
  };
  const targets = [[ENVOY, 'proto'], [CONNECT, 'proto'], [CONNECT, 'json']];
  for (const [baseUrl, codec] of targets) {
    const client = createClient(schema, { baseUrl, protocol: 'connect', codec, useGet: true, transport: fetchTransport({ fetch: recording }) });
    const reply = await client.unary(`${TESTING}/EchoMetadata`, {}, { metadata: { 'x-who': codec } });
    assert.equal(reply.metadata['x-who'], codec);
    const error = await rejection(client.unary('/helloworld.Greeter/SayHello', { name: 'x' }));
    assert.equal(error.code, Code.INVALID_ARGUMENT);
    assert.match(error.message, /SayHello is not idempotent/);
  }
  assert.deepEqual(methods, ['GET', 'GET', 'GET']);
});
