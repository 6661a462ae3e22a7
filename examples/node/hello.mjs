// examples/node/hello.mjs: the npm package in Node, over native gRPC
// (node:http2). `npm install grpc-wasm`, then:
//   node hello.mjs helloworld.proto http://127.0.0.1:50051
// `make packages` runs this file against the test server.
import { readFileSync } from 'node:fs';
import { loadProto, createClient } from 'grpc-wasm';

const [protoPath, baseUrl] = process.argv.slice(2);
const schema = loadProto({ 'helloworld.proto': readFileSync(protoPath, 'utf8') });
const client = createClient(schema, { baseUrl, protocol: 'grpc' });
try {
  const reply = await client.unary('/helloworld.Greeter/SayHello', { name: 'node' }, { timeoutMs: 5000 });
  console.log(reply.message);
} catch (e) {
  console.log(`${e.name}: ${e.message}`); // a GrpcError: e.code, e.details, e.metadata
} finally {
  client.close();
}
