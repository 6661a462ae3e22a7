// Options are taken by name: an unknown one (a misspelling, or another
// library's name such as `timeout`) is a TypeError that names the known
// ones, never a setting silently left at its default.

/** JSON options: of a call (`json`) and of Schema's encode and decode. */
export const JSON_OPTIONS = ['emitDefaults', 'enumsAsNumbers', 'protoFieldNames', 'ignoreUnknownFields', 'bigint'];
/** Options of one call, which a client's options give defaults for. */
export const CALL_OPTIONS = ['metadata', 'timeoutMs', 'signal', 'onStatus', 'json', 'maxMessageBytes', 'protocol',
  'codec', 'useGet'];
/** fetchTransport's options. */
export const FETCH_OPTIONS = ['fetch', 'credentials', 'mode'];
/** http2Transport's options. */
export const HTTP2_OPTIONS = ['baseUrl', 'ca', 'cert', 'key', 'servername', 'rejectUnauthorized'];
/** createClient's options: a call's defaults, and its transport's. */
export const CLIENT_OPTIONS = [...new Set([...CALL_OPTIONS, 'transport', ...FETCH_OPTIONS, ...HTTP2_OPTIONS])];

/**
 * Throws a TypeError for options that are not an object or hold a name
 * not in `known`; `where` names the function for the message.
 * @param {string} where
 * @param {unknown} options
 * @param {readonly string[]} known
 */
export function checkOptions(where, options, known) {
  if (options === undefined || options === null) return;
  // A Map or a class instance has no own keys to check: its settings would
  // all be dropped without a word.
  const proto = typeof options === 'object' ? Object.getPrototypeOf(options) : undefined;
  if (proto !== Object.prototype && proto !== null) {
    const what = Array.isArray(options) ? 'an array' : typeof options === 'object' ? 'a non-plain object' : typeof options;
    throw new TypeError(`${where}: options must be a plain object, not ${what}`);
  }
  const unknown = Object.keys(options).filter((name) => !known.includes(name));
  if (unknown.length) {
    const names = unknown.map((name) => `'${name}'`).join(', ');
    throw new TypeError(`${where}: unknown option ${names}; the options are ${known.join(', ')}`);
  }
}

/**
 * The options of `options` that `known` names: what a client hands its
 * transport, which checks them and gives them their type.
 * @param {Record<string, any>} options
 * @param {readonly string[]} known
 * @returns {any}
 */
export function pick(options, known) {
  return Object.fromEntries(Object.entries(options).filter(([name]) => known.includes(name)));
}
