// The fetch transport: browsers, and Node's own fetch. It sends a request
// body whole, so it carries unary and server-streaming calls.

import { FETCH_OPTIONS, checkOptions } from './options.js';

/**
 * @param {{fetch?: typeof fetch, credentials?: RequestCredentials, mode?: RequestMode}} [options]
 */
export function fetchTransport(options = {}) {
  checkOptions('fetchTransport', options, FETCH_OPTIONS);
  const doFetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  return {
    streamsRequests: false,
    async request({ url, method, headers, body, signal }) {
      const response = await doFetch(url, {
        method,
        headers,
        body,
        signal,
        credentials: options.credentials,
        mode: options.mode,
        redirect: 'error',
      });
      return {
        status: response.status,
        headers: [...response.headers].flat(),
        body: response.body ? chunks(response.body) : null,
        // fetch exposes no HTTP trailers: gRPC-Web and Connect need none.
        trailers: null,
      };
    },
  };
}

async function* chunks(stream) {
  const reader = stream.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      yield value;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
