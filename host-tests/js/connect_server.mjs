// A second stack for the package's gRPC-Web and Connect clients: Connect's
// own Node server (@connectrpc/connect-node), serving the test services
// from a descriptor set that protoc (grpcio-tools) wrote, over HTTP/1.1.
// Envoy's connect_grpc_bridge cannot carry Connect's JSON codec to the
// tonic servers (they speak no application/grpc+json), so JSON is tested
// here, against the protocol's reference implementation.
//
// Usage: node connect_server.mjs DESCRIPTOR_SET; prints "listening on HOST:PORT".
import http from 'node:http';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { createFileRegistry, fromBinary } from '@bufbuild/protobuf';
import { FileDescriptorSetSchema } from '@bufbuild/protobuf/wkt';
import { Code, ConnectError } from '@connectrpc/connect';
import { connectNodeAdapter } from '@connectrpc/connect-node';

const registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, readFileSync(process.argv[2])));
const service = (name) => registry.getService(name);
const message = (name) => registry.getMessage(name);

// The same details as the tonic testing server's Fail.
function details(code) {
  return [
    { desc: message('google.rpc.ErrorInfo'), value: { reason: 'TEST_FAILURE', domain: 'grpc-wasm.test', metadata: { requested_code: String(code) } } },
    { desc: message('google.rpc.BadRequest'), value: { fieldViolations: [{ field: 'code', description: 'requested failure' }] } },
  ];
}

function echoPrefixed(context) {
  for (const [name, value] of context.requestHeader) {
    if (!name.startsWith('x-echo-')) continue;
    context.responseHeader.set(name, value);
    context.responseTrailer.set(`${name}-trailer`, value);
  }
}

const routes = (router) => {
  router.service(service('helloworld.Greeter'), {
    sayHello: (request) => ({ message: `Hello ${request.name}!` }),
  });
  router.service(service('grpcwasm.testing.Testing'), {
    fail(request) {
      throw new ConnectError(request.message, request.code, undefined, request.withDetails ? details(request.code) : []);
    },
    async sleep(request, context) {
      await sleep(Number(request.millis), undefined, { signal: context.signal }).catch(() => {});
      if (context.signal.aborted) throw new ConnectError('deadline exceeded while sleeping', Code.DeadlineExceeded);
      return { sleptMillis: request.millis };
    },
    echoMetadata(_request, context) {
      echoPrefixed(context);
      return { metadata: Object.fromEntries(context.requestHeader) };
    },
    async *streamThenFail(request, context) {
      for (let i = 0; i < request.count; i++) {
        if (i > 0 && request.intervalMillis > 0n) await sleep(Number(request.intervalMillis), undefined, { signal: context.signal });
        yield { index: i };
      }
      if (request.code !== 0) throw new ConnectError(request.message, request.code);
    },
  });
};

const server = http.createServer(connectNodeAdapter({ routes }));
server.listen(0, '127.0.0.1', () => {
  const { address, port } = server.address();
  console.log(`listening on ${address}:${port}`);
});
