// JavaScript values at the boundary: what JSON.stringify cannot write
// (BigInt, Uint8Array), and 64-bit integers read back as BigInt on request.

/** JSON text of a message object: BigInt as a decimal string, bytes as base64. */
export function toJsonText(value) {
  // `this[key]` is the value before its toJSON: Node's Buffer has one, which
  // would turn the bytes into {"type": "Buffer", ...} first.
  return JSON.stringify(value ?? {}, function replace(key, v) {
    const raw = this[key];
    if (raw instanceof Uint8Array) return base64(raw);
    if (typeof v === 'bigint') return v.toString();
    return v;
  });
}

function base64(bytes) {
  let binary = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

const INT64 = new Set(['int64', 'uint64', 'sint64', 'fixed64', 'sfixed64']);
const INT64_WRAPPERS = new Set(['google.protobuf.Int64Value', 'google.protobuf.UInt64Value']);
// Well-known types whose JSON is not an object of their fields.
const OPAQUE = new Set([
  'google.protobuf.Any', 'google.protobuf.Struct', 'google.protobuf.Value',
  'google.protobuf.ListValue', 'google.protobuf.Timestamp', 'google.protobuf.Duration',
  'google.protobuf.FieldMask',
]);

/**
 * Turns the 64-bit integers of a decoded message (strings in proto3 JSON)
 * into BigInt, walking the message type's description.
 */
export function int64ToBigInt(describe, typeName, message) {
  if (message === null || typeof message !== 'object' || OPAQUE.has(typeName)) return message;
  const fields = describe(typeName).fields;
  for (const field of fields) {
    // Own keys only: a field named `constructor` or `valueOf` that the
    // message leaves out must not find Object.prototype's.
    const key = Object.hasOwn(message, field.jsonName) ? field.jsonName : field.name;
    if (!Object.hasOwn(message, key)) continue;
    message[key] = convert(describe, field, message[key]);
  }
  return message;
}

function convert(describe, field, value) {
  if (field.map) {
    for (const k of Object.keys(value)) value[k] = scalar(describe, field.map.value, value[k]);
    return value;
  }
  if (field.repeated) return value.map((v) => scalar(describe, field.type, v));
  return scalar(describe, field.type, value);
}

function scalar(describe, type, value) {
  if (typeof type === 'string') return INT64.has(type) && value !== null ? BigInt(value) : value;
  if (type.message && INT64_WRAPPERS.has(type.message)) return value === null ? value : BigInt(value);
  if (type.message) return int64ToBigInt(describe, type.message, value);
  return value;
}
