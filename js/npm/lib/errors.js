// GrpcError: how every failed call, and every bad input, reaches the caller.

/**
 * A failed call: the gRPC status, its decoded details, and the metadata of
 * the response (headers and trailers together, trailers winning).
 */
export class GrpcError extends Error {
  /**
   * @param {{code: number, name: string, message: string, details?: object[],
   *          headers?: Record<string, string|Uint8Array>,
   *          trailers?: Record<string, string|Uint8Array>}} status
   */
  constructor(status) {
    super(status.message);
    /** @type {number} */
    this.code = status.code;
    /** @type {string} the code's canonical name, e.g. "NOT_FOUND" */
    this.name = status.name;
    /** @type {object[]} google.rpc.Status details, each with its "@type" */
    this.details = status.details ?? [];
    /** @type {Record<string, string|Uint8Array>} */
    this.headers = status.headers ?? {};
    /** @type {Record<string, string|Uint8Array>} */
    this.trailers = status.trailers ?? {};
    /** @type {Record<string, string|Uint8Array>} */
    this.metadata = { ...this.headers, ...this.trailers };
  }
}

/** The status the core threw (its JSON text), or any other throw, as a GrpcError. */
export function asGrpcError(thrown, fallback) {
  if (thrown instanceof GrpcError) return thrown;
  if (typeof thrown === 'string') {
    try {
      return new GrpcError(withBytes(JSON.parse(thrown)));
    } catch {
      // not a status: fall through
    }
  }
  return fallback(thrown);
}

/** Metadata values the core sends as byte arrays (-bin keys) become Uint8Arrays. */
export function withBytes(status) {
  for (const key of ['headers', 'trailers']) {
    const metadata = status[key];
    if (!metadata) continue;
    for (const [name, value] of Object.entries(metadata)) {
      if (!Array.isArray(value)) continue;
      // One -bin value is an array of bytes; a repeated key, an array of those.
      metadata[name] = Array.isArray(value[0]) || typeof value[0] === 'string'
        ? value.map((one) => (Array.isArray(one) ? Uint8Array.from(one) : one))
        : Uint8Array.from(value);
    }
  }
  return status;
}

let codeNames = [];

/** The core's code names, indexed by code (set once the wasm module is loaded). */
export function useCodeNames(names) {
  codeNames = names;
}

/**
 * An error raised here rather than by a call's peer, with the code the core
 * numbers `name` (a canonical name, e.g. "INTERNAL").
 */
export function localError(name, message) {
  const code = codeNames.indexOf(name);
  if (code < 0) return new GrpcError({ code: codeNames.indexOf('UNKNOWN'), name: 'UNKNOWN', message, details: [] });
  return new GrpcError({ code, name, message, details: [] });
}
