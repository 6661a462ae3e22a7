// Schemas without a network: loading (.proto and descriptor sets, errors
// with their position), descriptions, encode/decode and their options, the
// lite build, and the package as npm resolves it (exports map, npm pack).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  loadProto, loadDescriptorSet, hasCompiler, protos, testSchema, createClient, fetchTransport, http2Transport, rejection,
} from './common.mjs';
import * as lite from '../../js/npm/lite/node.js';

const PACKAGE = fileURLToPath(new URL('../../js/npm/', import.meta.url));
const schema = testSchema();

test('a .proto that does not parse names its file, line and column', () => {
  assert.throws(() => loadProto({ 'bad.proto': 'syntax = "proto3";\nmessage A { int32 x = 1 }' }),
    { message: "bad.proto:2:25: expected ';' or '[', but found '}'" });
  assert.throws(() => loadProto({ 'a.proto': 'syntax = "proto3";\nimport "missing.proto";' }),
    /import 'missing.proto' not found/);
});

test('schema.openapi: the document a transcoder serves for the schema, in both builds', () => {
  const library = loadProto(protos('library.proto'));
  const document = library.openapi({ title: 'Library', streamFormat: 'sse', json: { protoFieldNames: true } });
  assert.equal(document.openapi, '3.1.0');
  assert.equal(document.info.title, 'Library');
  assert.equal(document.paths['/v1/shelves/{name_1}/books/{name_2}'].get.operationId, 'example_library_v1_Library_GetBook');
  assert.deepEqual(Object.keys(document.paths['/v1/shelves/{shelf}/books:stream'].get.responses['200'].content),
    ['text/event-stream']);
  assert.deepEqual(Object.keys(document.components.schemas['example.library.v1.ListBooksResponse'].properties),
    ['books', 'next_page_token']);
  // The lite build, from a descriptor set, writes the same document.
  const liteDocument = lite.loadDescriptorSet(library.descriptorSet())
    .openapi({ title: 'Library', streamFormat: 'sse', json: { protoFieldNames: true } });
  assert.deepEqual(liteDocument, document);
  assert.throws(() => library.openapi({ streamFormat: 'xml' }), { message: "streamFormat must be 'ndjson', 'sse' or 'array'" });
  assert.throws(() => library.openapi({ pretty: true }), TypeError);
});

test('services and descriptions', () => {
  const testing = schema.services().find((s) => s.name === 'grpcwasm.testing.Testing');
  assert.deepEqual(testing.methods.find((m) => m.name === 'EchoMetadata'), {
    kind: 'method', name: 'EchoMetadata', path: '/grpcwasm.testing.Testing/EchoMetadata', streaming: 'unary',
    input: 'grpcwasm.testing.Empty', output: 'grpcwasm.testing.MetadataReply', idempotent: true,
  });
  assert.equal(schema.describe('/routeguide.RouteGuide/RouteChat').streaming, 'bidi_streaming');
  assert.deepEqual(schema.describe('grpcwasm.testing.MetadataReply').fields, [
    { name: 'metadata', jsonName: 'metadata', number: 1, map: { key: 'string', value: 'string' } },
  ]);
  assert.deepEqual(schema.describe('grpcwasm.testing.NestRequest').fields[2],
    { name: 'child', jsonName: 'child', number: 3, type: { message: 'grpcwasm.testing.NestRequest' }, repeated: false });
  assert.throws(() => schema.describe('no.Such'), { message: "nothing named 'no.Such' is loaded" });
});

test('encode and decode: exact bytes, int64 as strings or BigInt, bytes as base64', () => {
  const bytes = schema.encode('grpcwasm.testing.SleepRequest', { millis: 12345678901234567n });
  assert.deepEqual([...bytes], [8, 135, 151, 173, 235, 197, 138, 247, 21]);
  assert.deepEqual(schema.decode('grpcwasm.testing.SleepRequest', bytes), { millis: '12345678901234567' });
  assert.deepEqual(schema.decode('grpcwasm.testing.SleepRequest', bytes, { bigint: true }), { millis: 12345678901234567n });
  const payload = schema.encode('grpcwasm.testing.LargeReply', { payload: new Uint8Array([0, 1, 255]) });
  assert.deepEqual(schema.decode('grpcwasm.testing.LargeReply', payload), { payload: 'AAH/' });
  assert.throws(() => schema.encode('grpcwasm.testing.SleepRequest', { millis: 1.5 }), /^Error: millis: /);
});

test("BigInt decoding reads a message's own fields, never Object.prototype's", () => {
  const odd = loadProto({ 'odd.proto': 'syntax = "proto3";\nmessage Odd { repeated string value_of = 1; int64 constructor = 2; int64 n = 3; }' });
  const bytes = odd.encode('Odd', { n: '7' });
  // Before, the absent fields found valueOf and constructor: a TypeError.
  assert.deepEqual(odd.decode('Odd', bytes, { bigint: true }), { n: 7n });
  assert.deepEqual(odd.decode('Odd', odd.encode('Odd', { constructor: '9' }), { bigint: true }), { constructor: 9n });
});

test('JSON options', () => {
  const type = 'grpcwasm.testing.FailRequest';
  const bytes = schema.fromJson(type, '{"code": 5, "with_details": true}');
  assert.equal(schema.toJson(type, bytes), '{"code":5,"withDetails":true}');
  assert.equal(schema.toJson(type, bytes, { protoFieldNames: true, emitDefaults: true }),
    '{"code":5,"message":"","with_details":true}');
  assert.throws(() => schema.fromJson(type, '{"nope": 1}'), /nope/);
  assert.equal(schema.toJson(type, schema.fromJson(type, '{"nope": 1}', { ignoreUnknownFields: true })), '{}');
});

test('the lite build: descriptor sets only, the same answers', () => {
  assert.equal(hasCompiler, true);
  assert.equal(lite.hasCompiler, false);
  assert.throws(() => lite.loadProto(protos('helloworld.proto')),
    { message: 'this build has no .proto compiler: load a descriptor set, or use the full build' });
  // A set protoc wrote, not our compiler.
  const fromProtoc = lite.loadDescriptorSet(readFileSync(process.env.DESCRIPTOR_SET));
  const value = { code: 9, message: 'é', withDetails: true };
  const bytes = fromProtoc.encode('grpcwasm.testing.FailRequest', value);
  assert.deepEqual(bytes, schema.encode('grpcwasm.testing.FailRequest', value));
  assert.deepEqual(fromProtoc.decode('grpcwasm.testing.FailRequest', bytes), value);
  assert.equal(loadDescriptorSet(schema.descriptorSet()).describe('routeguide.Point').fields.length, 2);
});

test('npm resolves the package by its exports map, and npm pack carries what it needs', () => {
  const probe = `const full = await import('grpc-wasm'); const lite = await import('grpc-wasm/lite');
    console.log(JSON.stringify([full.hasCompiler, typeof full.http2Transport, lite.hasCompiler]));`;
  const resolved = execFileSync('node', ['--input-type=module', '-e', probe], { cwd: PACKAGE, encoding: 'utf8' });
  assert.deepEqual(JSON.parse(resolved), [true, 'function', false]);
  const [packed] = JSON.parse(execFileSync('npm', ['pack', '--dry-run', '--json'], { cwd: PACKAGE, encoding: 'utf8' }));
  const files = packed.files.map((f) => f.path);
  for (const needed of ['browser.js', 'node.js', 'lite/browser.js', 'lib/client.js', 'wasm/full/grpc_wasm_bg.wasm',
    'wasm/lite/grpc_wasm_bg.wasm', 'wasm/full/grpc_wasm.js', 'types/node.d.ts', 'types/browser.d.ts', 'README.md']) {
    assert.ok(files.includes(needed), `npm pack lacks ${needed}: ${files.join(' ')}`);
  }
  assert.ok(!files.some((f) => f.startsWith('node_modules/')));
});

test('TypeScript compiles a user of the package against the .d.ts it ships', () => {
  // Inside the package, so that 'grpc-wasm' resolves to itself by its exports map.
  const dir = mkdtempSync(join(PACKAGE, '.consumer-'));
  try {
    copyFileSync(fileURLToPath(new URL('./consumer.ts', import.meta.url)), join(dir, 'consumer.ts'));
    const tsc = join(PACKAGE, 'node_modules', '.bin', 'tsc');
    const args = ['--noEmit', '--strict', '--skipLibCheck', '--target', 'es2022', '--module', 'nodenext',
      '--moduleResolution', 'nodenext', join(dir, 'consumer.ts')];
    try {
      execFileSync(tsc, args, { cwd: PACKAGE, encoding: 'utf8' });
    } catch (e) {
      assert.fail(`tsc: ${e.stdout}${e.stderr}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('an unknown option is a TypeError naming the known ones, in every entry point', async () => {
  const known = (where, name) => ({
    name: 'TypeError',
    message: new RegExp(`^${where}: unknown option '${name}'; the options are [A-Za-z, ]+$`),
  });
  assert.throws(() => createClient(schema, { baseUrl: 'http://127.0.0.1:1', timeout: 5000 }), known('createClient', 'timeout'));
  assert.throws(() => createClient(schema, { baseUrl: 'http://127.0.0.1:1', timeout: 5000 }), /, timeoutMs, /);
  assert.throws(() => createClient(schema, { baseUrl: 'http://127.0.0.1:1', json: { emitDefault: true } }),
    known('createClient: options.json', 'emitDefault'));
  const client = createClient(schema, { baseUrl: 'http://127.0.0.1:1', protocol: 'grpc' });
  // Refused before anything is sent: the unknown option, not the dead address, is the error.
  const error = await rejection(client.unary('/helloworld.Greeter/SayHello', { name: 'x' }, { timeout: 500 }));
  assert.equal(error.name, 'TypeError');
  assert.match(error.message, /^client\.unary: unknown option 'timeout'; the options are metadata, timeoutMs, /);
  const stream = client.serverStream('/routeguide.RouteGuide/ListFeatures', {}, { deadline: 1 });
  await assert.rejects(stream.next(), known('client.serverStream', 'deadline'));
  client.close();
  assert.throws(() => schema.encode('helloworld.HelloRequest', {}, { emit_defaults: true }), known('JSON options', 'emit_defaults'));
  assert.throws(() => fetchTransport({ credential: 'include' }), known('fetchTransport', 'credential'));
  assert.throws(() => http2Transport({ baseUrl: 'http://127.0.0.1:1', tls: true }), known('http2Transport', 'tls'));
  assert.throws(() => createClient(schema, 'http://127.0.0.1:1'), { name: 'TypeError', message: 'createClient: options must be a plain object, not string' });
  const unread = await rejection(client.unary('/helloworld.Greeter/SayHello', {}, new Map([['timeoutMs', 5]])));
  assert.deepEqual([unread.name, unread.message], ['TypeError', 'client.unary: options must be a plain object, not a non-plain object']);
  // Every option the docs name is taken.
  createClient(schema, {
    baseUrl: 'http://127.0.0.1:1', transport: undefined, fetch: globalThis.fetch, credentials: 'include', mode: 'cors',
    metadata: {}, timeoutMs: 1, signal: undefined, onStatus: undefined, json: { bigint: true }, maxMessageBytes: 1,
    protocol: 'grpc-web', codec: 'proto', useGet: false, ca: undefined, cert: undefined, key: undefined,
    servername: undefined, rejectUnauthorized: true,
  }).close();
});

test('an unknown method is UNIMPLEMENTED, as in the other hosts', async () => {
  const client = createClient(schema, { baseUrl: 'http://127.0.0.1:1', protocol: 'grpc' });
  const error = await rejection(client.unary('/helloworld.Greeter/SayBye', {}));
  client.close();
  assert.deepEqual([error.code, error.name, error.message],
    [12, 'UNIMPLEMENTED', "unknown method '/helloworld.Greeter/SayBye'"]);
});
