// What the node:test files share: the package, and the test protos loaded
// from the repository's protos/ at run time.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export * from '../../js/npm/node.js';
import { loadProto } from '../../js/npm/node.js';

const PROTOS = fileURLToPath(new URL('../../protos/', import.meta.url));

export function protos(...names) {
  return Object.fromEntries(names.map((n) => [n, readFileSync(PROTOS + n, 'utf8')]));
}

export function testSchema() {
  return loadProto(protos('testing.proto', 'route_guide.proto', 'helloworld.proto', 'echo.proto'));
}

export const TESTING = '/grpcwasm.testing.Testing';

/** The error a promise rejects with (fails the test if it resolves). */
export async function rejection(promise) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  throw new Error('expected the call to fail');
}
