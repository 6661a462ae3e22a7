// A schema: what has been loaded, its descriptions, and messages converted
// with it (the core's JSON mapping).

import { checkOptions } from './options.js';
import { int64ToBigInt, toJsonText } from './values.js';

/**
 * @typedef {object} JsonOptions
 * @property {boolean} [emitDefaults] write fields that hold their default value
 * @property {boolean} [enumsAsNumbers] write enums as numbers
 * @property {boolean} [protoFieldNames] write the .proto field names, not lowerCamelCase
 * @property {boolean} [ignoreUnknownFields] skip unknown fields in input JSON
 * @property {boolean} [bigint] read 64-bit integers as BigInt (strings by default)
 */

export class Schema {
  #inner;
  #jsonBits;
  #descriptions = new Map();

  /** @internal made by loadProto and loadDescriptorSet */
  constructor(inner, jsonBits) {
    this.#inner = inner;
    this.#jsonBits = jsonBits;
  }

  /** Every service, with its methods. */
  services() {
    return JSON.parse(this.#inner.services());
  }

  /** A service, method, message or enum by its full name. */
  describe(name) {
    let description = this.#descriptions.get(name);
    if (!description) {
      description = JSON.parse(this.#inner.describe(name));
      this.#descriptions.set(name, description);
    }
    return description;
  }

  /** Compiles more `.proto` files into this schema ({name: source}). */
  addProto(files) {
    const names = Object.keys(files);
    this.#inner.addProto(names, names.map((n) => String(files[n])));
    this.#descriptions.clear();
    return this;
  }

  /** Adds the files of a binary FileDescriptorSet. */
  addDescriptorSet(bytes) {
    this.#inner.addDescriptorSet(bytes);
    this.#descriptions.clear();
    return this;
  }

  /**
   * An OpenAPI 3.1 document of the REST API a transcoder (the grpc-wasm
   * filter) serves for this schema: every google.api.http binding an
   * operation, every method at POST /pkg.Service/Method, schemas as JSON
   * prints with `json`.
   * @param {{title?: string, streamFormat?: 'ndjson' | 'sse' | 'array', json?: JsonOptions,
   *          services?: string[]}} [options]
   * @returns {object}
   */
  openapi(options = {}) {
    checkOptions('schema.openapi', options, ['title', 'streamFormat', 'json', 'services']);
    const bits = this.#jsonBits(options.json ?? {});
    return JSON.parse(this.#inner.openapi(options.title ?? 'grpc-wasm', options.streamFormat ?? 'ndjson', bits,
      options.services));
  }

  /** Everything loaded, as a binary FileDescriptorSet. */
  descriptorSet() {
    return this.#inner.descriptorSet();
  }

  /** A message object → protobuf bytes. */
  encode(type, object, options) {
    return this.#inner.encode(type, toJsonText(object), this.#jsonBits(options));
  }

  /** Protobuf bytes → a message object (int64 as strings, or BigInt with {bigint: true}). */
  decode(type, bytes, options = {}) {
    const object = JSON.parse(this.#inner.decode(type, bytes, this.#jsonBits(options)));
    return options.bigint ? int64ToBigInt((n) => this.describe(n), type, object) : object;
  }

  /** Protobuf bytes → proto3 JSON text. */
  toJson(type, bytes, options) {
    return this.#inner.decode(type, bytes, this.#jsonBits(options));
  }

  /** Proto3 JSON text → protobuf bytes. */
  fromJson(type, json, options) {
    return this.#inner.encode(type, json, this.#jsonBits(options));
  }

  /** @internal a call's state in the core */
  _call(path, protocol, codec, options, maxMessageBytes) {
    return this.#inner.call(path, protocol, codec, this.#jsonBits(options), maxMessageBytes);
  }
}
