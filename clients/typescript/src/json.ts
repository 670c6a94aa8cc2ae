/**
 * JSON text of payloads and results, without the silent losses of `JSON.stringify`.
 *
 * `JSON.stringify` turns a `Map`, a `Set` or a class instance without enumerable fields into
 * `{}`, drops functions and symbols, writes `undefined` inside an array, a hole, `NaN` or an
 * infinity as `null`, and throws for a `BigInt`. For a payload that means two different
 * intents hash the same (the second replays the first); for a result, a replay that gives
 * back something else than the call did. {@link jsonText} refuses every such value with a
 * `TypeError` instead.
 *
 * @module
 */

/**
 * A value to send as JSON, never read as JSON text: a string becomes a JSON string. What a
 * function wrapped by `idempotent` or a journaled MCP tool returns is wrapped in it, so that
 * `"sent"` is stored as the string `"sent"` and a replay gives back an equal value. The
 * low-level `result` and `payload` arguments keep reading a plain string as JSON text.
 */
export class JsonValue {
  /** @param value the value; `undefined` as a result means no result body. */
  constructor(readonly value: unknown) {}
}

/**
 * `value` as JSON text, the way `JSON.stringify` writes it, but only for values that JSON
 * represents exactly: `null`, booleans, strings, finite numbers, arrays without holes or
 * `undefined` elements, and plain objects (made by `{}` or `Object.create(null)`). A member
 * whose value is `undefined` is left out, as if it were absent. An object with a `toJSON`
 * method (a `Date`, a `Buffer`, a `URL`, a class of yours) is written as what that returns
 * — a `Date` as its ISO text, so a replay gives back the text, not a `Date`.
 *
 * @throws {TypeError} for anything else — a `Map`, a `Set`, a class instance without
 *   `toJSON`, a function, a symbol, a `BigInt`, `NaN` or an infinity, `undefined` or a hole
 *   in an array, a symbol-keyed member, a cycle, or `undefined` itself. The message names
 *   the kind of value, never the value.
 */
export function jsonText(value: unknown): string {
  const text = encode(value, "", new Set());
  if (text === undefined) {
    throw new TypeError("undefined is not a JSON value");
  }
  return text;
}

function refuse(what: string): never {
  throw new TypeError(
    `${what} cannot be written as JSON without losing what it holds; pass plain data ` +
      "(objects, arrays, strings, finite numbers, booleans, null) or give it a toJSON method",
  );
}

/** One value as JSON text; undefined for `undefined` (left out of an object). */
function encode(input: unknown, key: string, open: Set<object>): string | undefined {
  let value = input;
  if ((typeof value === "object" && value !== null) || typeof value === "bigint") {
    const toJSON = (value as { toJSON?: unknown }).toJSON;
    if (typeof toJSON === "function") {
      value = (toJSON as (key: string) => unknown).call(value, key);
    }
  }
  switch (typeof value) {
    case "undefined":
      return undefined;
    case "string":
    case "boolean":
      return JSON.stringify(value);
    case "number":
      if (!Number.isFinite(value)) {
        refuse("NaN or an infinity");
      }
      return JSON.stringify(value);
    case "bigint":
      return refuse("a BigInt");
    case "symbol":
      return refuse("a symbol");
    case "function":
      return refuse("a function");
  }
  if (value === null) {
    return "null";
  }
  const object = value as object;
  if (open.has(object)) {
    throw new TypeError("a value that contains itself cannot be written as JSON");
  }
  open.add(object);
  try {
    if (Array.isArray(object)) {
      const items: string[] = [];
      for (let i = 0; i < object.length; i++) {
        if (!(i in object)) {
          refuse("a hole in an array");
        }
        const item = encode(object[i], String(i), open);
        if (item === undefined) {
          refuse("undefined inside an array");
        }
        items.push(item);
      }
      return `[${items.join(",")}]`;
    }
    const prototype: unknown = Object.getPrototypeOf(object);
    if (prototype !== Object.prototype && prototype !== null) {
      const name = (object as { constructor?: { name?: unknown } }).constructor?.name;
      refuse(typeof name === "string" && name !== "" ? `an instance of ${name}` : "an object that is not plain");
    }
    const symbols = Object.getOwnPropertySymbols(object);
    if (symbols.some((symbol) => Object.prototype.propertyIsEnumerable.call(object, symbol))) {
      refuse("a member keyed by a symbol");
    }
    const members: string[] = [];
    for (const name of Object.keys(object)) {
      const member = encode((object as Record<string, unknown>)[name], name, open);
      if (member !== undefined) {
        members.push(`${JSON.stringify(name)}:${member}`);
      }
    }
    return `{${members.join(",")}}`;
  } finally {
    open.delete(object);
  }
}
