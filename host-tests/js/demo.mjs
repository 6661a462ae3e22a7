// The README's Node example, run by `make demo`: one .proto loaded at run
// time, called three ways.
//
// Usage: node demo.mjs ENVOY_URL ROUTEGUIDE_URL
import { readFileSync } from 'node:fs';
import { loadProto, createClient } from '../../js/npm/node.js'; // from 'grpc-wasm' once installed

const [envoy, routeguide] = process.argv.slice(2);
const read = (name) => readFileSync(new URL(`../../protos/${name}`, import.meta.url), 'utf8');
const schema = loadProto({ 'helloworld.proto': read('helloworld.proto'), 'route_guide.proto': read('route_guide.proto') });

// gRPC-Web, through Envoy's grpc_web filter.
const web = createClient(schema, { baseUrl: envoy, protocol: 'grpc-web' });
console.log('gRPC-Web via Envoy:', await web.unary('/helloworld.Greeter/SayHello', { name: 'web' }));

// Connect with JSON bodies, through Envoy's connect_grpc_bridge filter (to
// tonic, protobuf: the bridge carries Connect's JSON only to servers that
// speak application/grpc+json).
const connect = createClient(schema, { baseUrl: envoy, protocol: 'connect', codec: 'proto' });
console.log('Connect via Envoy:', await connect.unary('/helloworld.Greeter/SayHello', { name: 'connect' }));

// Native gRPC over node:http2, straight to the server; a stream read as it arrives.
const grpc = createClient(schema, { baseUrl: routeguide, protocol: 'grpc' });
const area = { lo: { latitude: 400000000, longitude: -750000000 }, hi: { latitude: 420000000, longitude: -730000000 } };
let count = 0;
for await (const feature of grpc.serverStream('/routeguide.RouteGuide/ListFeatures', area)) {
  if (count++ === 0) console.log('gRPC over node:http2, first feature:', feature);
}
console.log(`gRPC over node:http2: ${count} features streamed`);
grpc.close();
