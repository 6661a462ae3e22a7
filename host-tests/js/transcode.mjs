#!/usr/bin/env node
// The differential test's batch tool (host-tests/src/bin/transcode.rs),
// spoken by the npm package: the same line protocol, so that the corpus
// runs through the package as it runs through the core.
//
// Usage: transcode.mjs DIR FILE.proto...
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import path from 'node:path';
import { loadProto } from '../../js/npm/node.js';

const [dir, ...names] = process.argv.slice(2);
const schema = loadProto(Object.fromEntries(names.map((n) => [n, readFileSync(path.join(dir, n), 'utf8')])));

function options(given = {}) {
  if (given.int64_as_number) throw new Error('int64_as_number: the package writes 64-bit integers as strings (or BigInt)');
  return {
    emitDefaults: !!given.emit_defaults,
    enumsAsNumbers: !!given.enums_as_numbers,
    protoFieldNames: !!given.proto_field_names,
    ignoreUnknownFields: !!given.ignore_unknown_fields,
  };
}

function answer(request) {
  try {
    if (typeof request.json === 'string') {
      const bytes = schema.fromJson(request.type, request.json, options(request.options));
      return { bin: Buffer.from(bytes).toString('base64'), json: schema.toJson(request.type, bytes) };
    }
    const bytes = Buffer.from(request.bin, 'base64');
    return { json: schema.toJson(request.type, bytes, options(request.options)) };
  } catch (e) {
    return { error: e.message };
  }
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  process.stdout.write(`${JSON.stringify(answer(JSON.parse(line)))}\n`);
}
