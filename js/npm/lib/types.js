// The types a TypeScript user names, re-exported by every entry point
// (`import type { CallOptions } from 'grpc-wasm'`). Nothing at run time.

/**
 * @typedef {import('./client.js').Metadata} Metadata
 * @typedef {import('./client.js').Status} Status
 * @typedef {import('./client.js').CallOptions} CallOptions
 * @typedef {import('./client.js').ClientOptions} ClientOptions
 * @typedef {import('./client.js').Client} Client
 * @typedef {import('./schema.js').Schema} Schema
 * @typedef {import('./schema.js').JsonOptions} JsonOptions
 */

export {};
