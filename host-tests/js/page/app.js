// docs/browser.md's page example, run by `make test` (host-tests/js/test_js.py)
// in Chromium under a strict Content-Security-Policy: a .proto loaded at run
// time, and calls to a gRPC server through Envoy's grpc_web filter.
import { loadProto, createClient, GrpcError } from '/pkg/browser.js';

const show = (id, text) => { document.getElementById(id).textContent = text; };
const envoy = new URLSearchParams(location.search).get('envoy');

async function main() {
  const files = {};
  for (const name of ['helloworld.proto', 'route_guide.proto', 'testing.proto']) {
    files[name] = await (await fetch(`/protos/${name}`)).text();
  }
  const schema = loadProto(files);
  const client = createClient(schema, { baseUrl: envoy, protocol: 'grpc-web' });

  const reply = await client.unary('/helloworld.Greeter/SayHello', { name: 'browser' });
  show('hello', reply.message);

  const names = [];
  const area = { lo: { latitude: 400000000, longitude: -750000000 }, hi: { latitude: 420000000, longitude: -730000000 } };
  for await (const feature of client.serverStream('/routeguide.RouteGuide/ListFeatures', area, { protocol: 'grpc-web-text' })) {
    names.push(feature.name);
    show('features', `${names.length} features, first: ${names[0]}`);
  }

  const connect = createClient(schema, { baseUrl: envoy, protocol: 'connect', codec: 'proto' });
  show('connect', (await connect.unary('/helloworld.Greeter/SayHello', { name: 'connect' })).message);

  try {
    await client.unary('/grpcwasm.testing.Testing/Fail', { code: 7, message: 'not for you', withDetails: true });
    show('error', 'no error?');
  } catch (e) {
    if (!(e instanceof GrpcError)) throw e;
    show('error', `${e.name}: ${e.message} [${e.details.map((d) => d['@type'].split('/').pop()).join(', ')}]`);
  }
}

main()
  .catch((e) => show('log', `failed: ${e.name}: ${e.message}`))
  .finally(() => document.body.setAttribute('data-done', 'true'));
