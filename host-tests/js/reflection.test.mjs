// loadFromReflection: schemas from the servers' own reflection, then calls
// of every kind with no .proto file: over node:http2 (gRPC) to tonic's v1
// and v1alpha and to grpcio's, and over fetch (gRPC-Web) through Envoy's
// grpc_web filter, as a browser loads one.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createClient, loadFromReflection, GrpcError, rejection } from './common.mjs';
import * as lite from '../../js/npm/lite/node.js';

const grpc = (url) => ({ baseUrl: url, protocol: 'grpc' });
const ORCHARD = { latitude: 409012345, longitude: -742567890 };
const AREA = { lo: { latitude: 400000000, longitude: -750000000 }, hi: { latitude: 420000000, longitude: -730000000 } };

async function everyKind(client) {
  const feature = await client.unary('/routeguide.RouteGuide/GetFeature', ORCHARD);
  let features = 0;
  for await (const _ of client.serverStream('/routeguide.RouteGuide/ListFeatures', AREA)) features++;
  return { name: feature.name, features };
}

test('tonic v1 over node:http2: the services, then all four call kinds', async () => {
  const options = grpc(process.env.ROUTEGUIDE_URL);
  const schema = await loadFromReflection(options);
  assert.deepEqual(schema.services().map((s) => s.name), ['routeguide.RouteGuide']);
  assert.equal(schema.describe('routeguide.RouteGuide/RouteChat').streaming, 'bidi_streaming');
  const client = createClient(schema, options);
  try {
    assert.deepEqual(await everyKind(client), { name: '12 Orchard Lane, Chester, NJ 07930, USA', features: 35 });
    const summary = await client.clientStream('/routeguide.RouteGuide/RecordRoute', [ORCHARD, ORCHARD]);
    assert.equal(summary.pointCount, 2);
    const notes = [];
    const note = (message) => ({ location: { latitude: 1, longitude: 1 }, message });
    for await (const n of client.bidiStream('/routeguide.RouteGuide/RouteChat', [note('one'), note('two')])) {
      notes.push(n.message);
    }
    assert.deepEqual(notes, ['one']);
  } finally {
    client.close();
  }
});

test('tonic v1alpha only (an older server), the service asked for', async () => {
  const options = grpc(process.env.GREETER_V1ALPHA_URL);
  const schema = await loadFromReflection(options, { services: ['helloworld.Greeter'] });
  const client = createClient(schema, options);
  try {
    assert.deepEqual(await client.unary('/helloworld.Greeter/SayHello', { name: 'reflection' }),
      { message: 'Hello reflection!' });
  } finally {
    client.close();
  }
});

test("grpcio's reflection (a second stack)", async () => {
  const options = grpc(process.env.SHELVES_URL);
  const schema = await loadFromReflection(options);
  assert.deepEqual(schema.services().map((s) => s.name), ['shelves.Bookstore']);
  const client = createClient(schema, options);
  try {
    assert.deepEqual(await client.unary('/shelves.Bookstore/GetShelf', { shelf: 7 }), { id: '7', theme: 'theme 7' });
  } finally {
    client.close();
  }
});

test("gRPC-Web over fetch through Envoy's grpc_web filter, as a browser loads it", async () => {
  const options = { baseUrl: process.env.ENVOY_URL };
  const schema = await loadFromReflection(options, { services: ['routeguide.RouteGuide'] });
  assert.deepEqual(await everyKind(createClient(schema, options)),
    { name: '12 Orchard Lane, Chester, NJ 07930, USA', features: 35 });
});

test('the lite build (no .proto compiler) loads from reflection alike', async () => {
  const options = grpc(process.env.ROUTEGUIDE_URL);
  const schema = await lite.loadFromReflection(options);
  const client = lite.createClient(schema, options);
  try {
    assert.deepEqual(await everyKind(client), { name: '12 Orchard Lane, Chester, NJ 07930, USA', features: 35 });
  } finally {
    client.close();
  }
});

test('failures reject with the gRPC code, and bad options with a TypeError', async () => {
  const none = await rejection(loadFromReflection(grpc(process.env.PLAIN_URL)));
  assert.ok(none instanceof GrpcError);
  assert.equal(none.name, 'UNIMPLEMENTED');
  assert.equal(none.message,
    'the server has no reflection service (grpc.reflection.v1 and v1alpha are UNIMPLEMENTED)');
  const unknown = await rejection(loadFromReflection(grpc(process.env.ROUTEGUIDE_URL), { services: ['routeguide.Nope'] }));
  assert.equal(unknown.name, 'NOT_FOUND');
  assert.match(unknown.message, /service 'routeguide\.Nope'/);
  const started = Date.now();
  const late = await rejection(loadFromReflection(grpc(process.env.SILENT_URL), { timeoutMs: 300 }));
  assert.equal(late.name, 'DEADLINE_EXCEEDED');
  assert.equal(late.message, 'deadline of 300 ms exceeded while loading through reflection');
  assert.ok(Date.now() - started < 2000);
  const down = await rejection(loadFromReflection(grpc('http://127.0.0.1:1'), { timeoutMs: 3000 }));
  assert.equal(down.name, 'UNAVAILABLE');
  await assert.rejects(loadFromReflection(grpc(process.env.ROUTEGUIDE_URL), { services: 'routeguide.RouteGuide' }),
    { name: 'TypeError', message: 'loadFromReflection: services must be a non-empty array of service names' });
  await assert.rejects(loadFromReflection(grpc(process.env.ROUTEGUIDE_URL), { timeout: 5 }), { name: 'TypeError' });
  const connect = await rejection(loadFromReflection({ baseUrl: process.env.ENVOY_URL, protocol: 'connect' }));
  assert.equal(connect.name, 'INVALID_ARGUMENT');
});
