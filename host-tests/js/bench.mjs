// `make bench-js`: the package against protobuf.js (parse at run time, no
// code generation) and @bufbuild/protobuf (a registry from a descriptor
// set), measured side by side in one run. Prints JSON for bench.py.
//
// Usage: node bench.mjs CORPUS.json ENVOY_URL
import { readFileSync } from 'node:fs';
import protobuf from 'protobufjs';
import { createFileRegistry, fromBinary, fromJson, toBinary, toJson } from '@bufbuild/protobuf';
import { FileDescriptorSetSchema } from '@bufbuild/protobuf/wkt';
import { loadProto, createClient } from '../../js/npm/node.js';

const [corpusPath, envoy] = process.argv.slice(2);
const read = (p) => readFileSync(new URL(p, import.meta.url), 'utf8');
const sources = {
  'differential.proto': read('../differential/differential.proto'),
  'helloworld.proto': read('../../protos/helloworld.proto'),
};
const ours = loadProto(sources);
const root = new protobuf.Root();
root.resolvePath = (_origin, target) => target;
// protobuf.parse leaves imports to the caller; the well-known types come
// with protobuf.js as its "common" files.
const common = new Set();
for (const text of Object.values(sources)) {
  for (const file of protobuf.parse(text, root).imports ?? []) {
    const json = protobuf.common.get(file);
    if (json && !common.has(file)) root.addJSON(json.nested);
    common.add(file);
  }
}
root.resolveAll();
const registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, ours.descriptorSet()));

const TO_OBJECT = { longs: String, enums: String, bytes: String, json: true };
const codecs = {
  'grpc-wasm': (type) => (object) => ours.decode(type, ours.encode(type, object)),
  'protobuf.js': (type) => {
    const T = root.lookupType(type);
    return (object) => T.toObject(T.decode(T.encode(T.fromObject(object)).finish()), TO_OBJECT);
  },
  '@bufbuild/protobuf': (type) => {
    const desc = registry.getMessage(type);
    return (object) => toJson(desc, fromBinary(desc, toBinary(desc, fromJson(desc, object))));
  },
};

const repeated = (n) => ({
  rInt64: Array.from({ length: n }, (_, i) => String(i * 1_000_003)),
  rString: Array.from({ length: n }, (_, i) => `string number ${i}`),
  rMessage: Array.from({ length: n }, (_, i) => ({ a: i, b: `inner ${i}` })),
  rDouble: Array.from({ length: n }, (_, i) => i / 7),
});
const MESSAGES = {
  small: ['helloworld.HelloRequest', { name: 'world' }],
  medium: ['diff.Scalars', {
    fDouble: 1.25, fFloat: 2.5, fInt32: -7, fInt64: '-70', fUint32: 7, fUint64: '70', fSint32: -9, fSint64: '-90',
    fFixed32: 11, fFixed64: '110', fSfixed32: -13, fSfixed64: '-130', fBool: true, fString: 'some text', fBytes: 'AAE=', fEnum: 'GREEN',
  }],
  large: ['diff.Repeated', repeated(1000)],
};

function time(fn, object, budgetMs) {
  let n = 0;
  const started = performance.now();
  while (performance.now() - started < budgetMs) {
    fn(object);
    n++;
  }
  return (performance.now() - started) * 1e6 / n;
}

// Round-robin rounds, best of each: the noisy machine slows one round, not one codec.
const codec = {};
for (const [size, [type, object]] of Object.entries(MESSAGES)) {
  const fns = Object.fromEntries(Object.entries(codecs).map(([name, make]) => [name, make(type)]));
  const best = {};
  for (let round = 0; round < 5; round++) {
    for (const [name, fn] of Object.entries(fns)) best[name] = Math.min(best[name] ?? Infinity, time(fn, object, 300));
  }
  codec[size] = best;
}

// JSON differences against protobuf.js on the differential corpus, where
// the package answers as Google's runtime does (make differential).
const corpus = JSON.parse(readFileSync(corpusPath, 'utf8'));
let differences = 0;
const examples = [];
const canonical = (v) => JSON.stringify(v, (_k, x) => (x && typeof x === 'object' && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort()) : x));
for (const c of corpus) {
  const T = root.lookupType(c.type);
  let mine;
  let theirs;
  try {
    const bytes = c.json !== undefined ? ours.fromJson(c.type, c.json) : Buffer.from(c.bin, 'base64');
    mine = JSON.parse(ours.toJson(c.type, bytes));
  } catch {
    mine = 'rejected';
  }
  try {
    const message = c.json !== undefined ? T.fromObject(JSON.parse(c.json)) : T.decode(Buffer.from(c.bin, 'base64'));
    theirs = T.toObject(T.decode(T.encode(message).finish()), TO_OBJECT);
  } catch {
    theirs = 'rejected';
  }
  if (canonical(mine) !== canonical(theirs)) {
    differences++;
    if (examples.length < 3) examples.push({ case: c.id, ours: mine, protobufjs: theirs });
  }
}

// Calls per second through Envoy's grpc_web filter: the package against a
// hand-written fetch that frames protobuf.js's bytes itself.
const client = createClient(ours, { baseUrl: envoy, protocol: 'grpc-web' });
const Hello = root.lookupType('helloworld.HelloRequest');
const Reply = root.lookupType('helloworld.HelloReply');
async function handWritten() {
  const message = Hello.encode({ name: 'bench' }).finish();
  const body = new Uint8Array(5 + message.length);
  new DataView(body.buffer).setUint32(1, message.length);
  body.set(message, 5);
  const response = await fetch(`${envoy}/helloworld.Greeter/SayHello`, {
    method: 'POST', body, headers: { 'content-type': 'application/grpc-web+proto', 'x-grpc-web': '1' },
  });
  const bytes = new Uint8Array(await response.arrayBuffer());
  const length = new DataView(bytes.buffer).getUint32(1);
  return Reply.toObject(Reply.decode(bytes.subarray(5, 5 + length)));
}
const callers = {
  'grpc-wasm': () => client.unary('/helloworld.Greeter/SayHello', { name: 'bench' }),
  'fetch + protobuf.js': handWritten,
};
const calls = {};
for (let round = 0; round < 3; round++) {
  for (const [name, call] of Object.entries(callers)) {
    const started = performance.now();
    let n = 0;
    while (performance.now() - started < 2000) {
      await Promise.all(Array.from({ length: 4 }, call));
      n += 4;
    }
    calls[name] = Math.max(calls[name] ?? 0, n / ((performance.now() - started) / 1000));
  }
}

console.log(JSON.stringify({ codec, differences, cases: corpus.length, examples, calls }));
