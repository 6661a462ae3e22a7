// A TypeScript user of the package, compiled (not run) against the .d.ts
// it ships: what the README shows must type-check, and what the types
// forbid must not (each @ts-expect-error fails the compile if it passes).
import { Code, GrpcError, createClient, hasCompiler, loadProto } from 'grpc-wasm';
import type { CallOptions, Status } from 'grpc-wasm';

const schema = loadProto({ 'hello.proto': 'syntax = "proto3"; package h; message M { string name = 1; }' });
const client = createClient(schema, { baseUrl: 'http://127.0.0.1:1', protocol: 'grpc-web' });
const compiles: boolean = hasCompiler;

export async function call(): Promise<string> {
  const options: CallOptions = { timeoutMs: 500, metadata: { 'x-id': '1', 'trace-bin': new Uint8Array([1]) } };
  try {
    const reply = await client.unary('/h.S/M', { name: 'x' }, options);
    return String(reply.name) + compiles;
  } catch (e) {
    if (e instanceof GrpcError && e.code === Code.NOT_FOUND) {
      const name: string = e.name;
      const trailers: Record<string, string | Uint8Array> = e.trailers;
      return name + Object.keys(trailers).length;
    }
    throw e;
  }
}

export async function stream(): Promise<Status> {
  const messages = client.serverStream('/h.S/L', {}, { onStatus: (status: Status) => status.code });
  for (;;) {
    const next = await messages.next();
    if (next.done) return next.value;
  }
}

// @ts-expect-error: a client needs its baseUrl
createClient(schema, {});
// @ts-expect-error: the deadline is timeoutMs, a number
client.unary('/h.S/M', {}, { timeoutMs: '5s' });
// @ts-expect-error: no such protocol
createClient(schema, { baseUrl: 'http://x', protocol: 'http3' });
