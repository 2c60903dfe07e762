// Strict decoding of an execution's result: plain JSON as itself, and the objects marked
// "$airlock" (README: "What comes back") as the values of ./values.ts. Nothing in a payload is
// evaluated or looked up by name; anything airlock would not send is a DecodeError that says
// where, as the Python client's decoder does (clients/forms.json is both clients' table).

import { ProtocolError } from "./errors.js";
import { put } from "./json.js";
import {
  Complex,
  DataFrame,
  Decimal,
  NDArray,
  type NDArrayData,
  PyDate,
  PyDateTime,
  PySet,
  PyTime,
  Repr,
  Series,
  Timedelta,
  type JsonObject,
  type Value,
} from "./values.js";

const MARK = "$airlock";

/** A result that is not what airlock sends: `path` says where (`$.result[2].items[0]`),
 * `reason` what is wrong. */
export class DecodeError extends ProtocolError {
  override name = "DecodeError";

  constructor(
    /** Where, from `$` (the value given to `decode`, or the answer `where` names), as
     * `$.a[0]["b c"]`. */
    readonly path: string,
    /** What is wrong there. */
    readonly reason: string,
  ) {
    super(`${path}: ${reason}`, { code: "protocol_error", status: 200 });
  }
}

/** Bounds on what {@link decode} accepts. */
export interface DecodeOptions {
  /** How many arrays, objects and forms may hold one another (default 128). */
  maxDepth?: number;
  /** How many values there may be in all (default 1 000 000). */
  maxItems?: number;
  /** Where `raw` sits in the answer it came in, as keys and indexes from `$` (`["result"]`
   * names an execution's result `$.result`): errors name their paths from there. */
  where?: readonly (string | number)[];
}

/**
 * Turns a result, parsed from JSON (by {@link parseJson}, which keeps big integers exact, or
 * `JSON.parse`), into {@link Value}s; throws a {@link DecodeError} naming the path of the
 * first thing airlock would not send: an unknown form, a field missing or of the wrong type,
 * a bound passed.
 */
export function decode(raw: unknown, options: DecodeOptions = {}): Value {
  let path: Path = null;
  for (const step of options.where ?? []) path = at(path, step);
  return new Decoder(options.maxDepth ?? 128, options.maxItems ?? 1_000_000).value(raw, path, undefined, 0);
}

// Where a value sits, as links to its parent, rendered only on error.
type Step = string | number;
type Path = { readonly parent: Path; readonly step: Step } | null;

const IDENTIFIER = /^[\p{L}\p{Nl}_][\p{L}\p{Nl}\p{Mn}\p{Mc}\p{Nd}\p{Pc}]*$/u;

function render(path: Path): string {
  const parts: string[] = [];
  for (let at = path; at !== null; at = at.parent) {
    const step = at.step;
    if (typeof step === "number") parts.push(`[${step}]`);
    else if (IDENTIFIER.test(step)) parts.push(`.${step}`);
    // As Python's json.dumps writes it, so both clients name a key alike.
    else parts.push(`[${JSON.stringify(step).replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`)}]`);
  }
  return "$" + parts.reverse().join("");
}

const at = (parent: Path, step: Step): Path => ({ parent, step });

type RawObject = Record<string, unknown>;

function isPlainObject(value: object): value is RawObject {
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "object") return isPlainObject(value) ? "object" : value.constructor.name;
  return typeof value;
}

// The "int" form: an integer past 64 bits, in decimal, of at most 4300 digits (the sandbox
// sends a repr past CPython's default limit).
const INT_DIGITS = 4300;
const INT_FORM = /^-?(0|[1-9][0-9]*)$/;
const NON_FINITE: Record<string, number> = { nan: NaN, inf: Infinity, "-inf": -Infinity };

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Whether `text` is standard base64 with its padding, as the server writes it. */
export function isBase64(text: string): boolean {
  return BASE64.test(text);
}

// Decimal's text as str() writes it (Python's Decimal reads more: spaces, underscores).
const DECIMAL = /^[+-]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|s?nan\d*)$/i;

// isoformat()'s text: a date, a clock with 6 (or for a pandas Timestamp 9) digits of the second
// where it has any, and a UTC offset of hours, minutes and maybe seconds and microseconds.
const DATE = /^(\d{4})-(\d{2})-(\d{2})$/;
const CLOCK = String.raw`(\d{2}):(\d{2}):(\d{2})(?:\.(\d{6}|\d{9}))?(?:([+-])(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{6}))?)?)?`;
const TIME = new RegExp(`^${CLOCK}$`);
const DATETIME = new RegExp(`^(\\d{4})-(\\d{2})-(\\d{2})T${CLOCK}$`);

const DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

function validDate(year: number, month: number, day: number): boolean {
  const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
  const days = month === 2 && leap ? 29 : (DAYS_IN_MONTH[month - 1] ?? 0);
  return year >= 1 && day >= 1 && day <= days;
}

type Clock = { hour: number; minute: number; second: number; nanosecond: number; offset: number | null };

// The clock's fields from `match` at `first` (CLOCK's nine groups), or null where out of range.
function clock(match: RegExpExecArray, first: number, nanos: boolean): Clock | null {
  const group = (i: number): string | undefined => match[first + i];
  const hour = Number(group(0));
  const minute = Number(group(1));
  const second = Number(group(2));
  const fraction = group(3);
  if (hour > 23 || minute > 59 || second > 59) return null;
  if (fraction !== undefined && fraction.length === 9 && !nanos) return null;
  const nanosecond = fraction === undefined ? 0 : Number(fraction.padEnd(9, "0"));
  let offset: number | null = null;
  const sign = group(4);
  if (sign !== undefined) {
    const minutes = Number(group(6));
    const seconds = Number(group(7) ?? 0);
    const micros = Number(group(8) ?? 0);
    if (minutes > 59 || seconds > 59) return null;
    offset = Number(group(5)) * 3600 + minutes * 60 + seconds + micros / 1e6;
    if (offset >= 86_400) return null;
    if (sign === "-") offset = -offset;
  }
  return { hour, minute, second, nanosecond, offset };
}

function roundHalfEven(x: number): number {
  const floor = Math.floor(x);
  const rest = x - floor;
  if (rest > 0.5 || (rest === 0.5 && floor % 2 !== 0)) return floor + 1;
  return floor;
}

// numpy's dtypes as str(dtype) names them: kind (numpy's letter) and bytes a cell.
type DType = { kind: string; size: number };
const NAMED_DTYPES: Record<string, DType> = { bool: { kind: "b", size: 1 }, object: { kind: "O", size: 8 } };
for (const [name, kind, sizes] of [
  ["int", "i", [1, 2, 4, 8]],
  ["uint", "u", [1, 2, 4, 8]],
  ["float", "f", [2, 4, 8, 12, 16]],
  ["complex", "c", [8, 16, 24, 32]],
] as const) {
  for (const size of sizes) NAMED_DTYPES[`${name}${size * 8}`] = { kind, size };
}
const CODED_DTYPE = /^[<>|=]?(?:([biufc])(\d+)|([USV])(\d+)|(O))$/;
const TIME_DTYPE = /^(?:(datetime64|timedelta64)|[<>|=]?([Mm])8)(?:\[\d*(?:Y|M|W|D|h|m|s|ms|us|ns|ps|fs|as)\])?$/;
const SIZES: Record<string, readonly number[]> = { b: [1], i: [1, 2, 4, 8], u: [1, 2, 4, 8], f: [2, 4, 8, 12, 16], c: [8, 16, 24, 32] };

function parseDType(name: string): DType | null {
  const named = NAMED_DTYPES[name];
  if (named !== undefined) return named;
  const time = TIME_DTYPE.exec(name);
  if (time !== null) return { kind: time[1] === "timedelta64" || time[2] === "m" ? "m" : "M", size: 8 };
  const coded = CODED_DTYPE.exec(name);
  if (coded === null) return null;
  if (coded[5] !== undefined) return { kind: "O", size: 8 };
  if (coded[1] !== undefined) {
    const size = Number(coded[2]);
    return SIZES[coded[1]]?.includes(size) ? { kind: coded[1], size } : null;
  }
  const kind = coded[3] as string;
  return { kind, size: Number(coded[4]) * (kind === "U" ? 4 : 1) };
}

// The most an array's cells may take, as numpy would hold them: airlock sends at most 100 000.
const MAX_ARRAY_BYTES = 256 * 2 ** 20;
// numpy 1.x's most dimensions.
const MAX_DIMS = 32;

const INT_BOUNDS: Record<string, readonly [bigint, bigint]> = {};
for (const size of [1, 2, 4, 8]) {
  const bits = BigInt(size * 8);
  INT_BOUNDS[`i${size}`] = [-(1n << (bits - 1n)), (1n << (bits - 1n)) - 1n];
  INT_BOUNDS[`u${size}`] = [0n, (1n << bits) - 1n];
}

const TYPED: Record<string, new (length: number) => NDArrayData> = {
  i1: Int8Array,
  i2: Int16Array,
  i4: Int32Array,
  i8: BigInt64Array,
  u1: Uint8Array,
  u2: Uint16Array,
  u4: Uint32Array,
  u8: BigUint64Array,
  f4: Float32Array,
};

// The label of a column (or a record's key) as something to compare: a string as itself,
// anything else as its kind and contents.
function labelKey(value: Value): string {
  if (typeof value === "string") return "s" + value;
  if (typeof value === "number") return Number.isNaN(value) ? "nan" : "n" + String(value);
  if (typeof value === "bigint") return "n" + value.toString();
  if (value === null || typeof value === "boolean") return String(value);
  if (Array.isArray(value)) return `(${value.map(labelKey).join(",")})`;
  if (value instanceof PySet) return `{${[...value].map(labelKey).sort().join(",")}}`;
  if (value instanceof Uint8Array) return "b" + value.join(".");
  if (value instanceof Complex) return `c${labelKey(value.real)},${labelKey(value.imag)}`;
  if (value instanceof Timedelta) return `td${value.totalMicroseconds()}`;
  return `${value.constructor.name}:${String(value)}`;
}

class Decoder {
  private left: number;

  constructor(
    private readonly maxDepth: number,
    private readonly maxItems: number,
  ) {
    this.left = maxItems;
  }

  private fail(path: Path, reason: string): never {
    throw new DecodeError(render(path), reason);
  }

  /** `raw`, at `step` of `parent` (the root where `step` is undefined), held by `depth`
   * arrays, objects and forms. */
  value(raw: unknown, parent: Path, step: Step | undefined, depth: number): Value {
    if (--this.left < 0) this.fail(step === undefined ? parent : at(parent, step), `more than ${this.maxItems} values`);
    switch (typeof raw) {
      case "string":
      case "boolean":
      case "bigint":
        return raw;
      case "number":
        if (!Number.isFinite(raw)) {
          this.fail(step === undefined ? parent : at(parent, step), 'a non-finite number (airlock sends those as a "float" form)');
        }
        return raw;
      case "object":
        if (raw === null) return null;
        break;
    }
    const here = step === undefined ? parent : at(parent, step);
    if (typeof raw !== "object" || raw === null || !(Array.isArray(raw) || isPlainObject(raw))) {
      return this.fail(here, `not a JSON value: ${typeName(raw)}`);
    }
    if (depth >= this.maxDepth) this.fail(here, `nested more than ${this.maxDepth} deep`);
    if (Array.isArray(raw)) {
      const out: Value[] = new Array<Value>(raw.length);
      for (let i = 0; i < raw.length; i++) out[i] = this.value(raw[i], here, i, depth + 1);
      return out;
    }
    if (Object.hasOwn(raw, MARK)) return this.form(raw, here, depth);
    const out: JsonObject = {};
    for (const name of Object.keys(raw)) {
      const item = this.value(raw[name], here, name, depth + 1);
      if (name === "__proto__") put(out, name, item);
      else out[name] = item;
    }
    return out;
  }

  private form(obj: RawObject, here: Path, depth: number): Value {
    const kind = obj[MARK];
    if (typeof kind !== "string") this.fail(at(here, MARK), `expected a string, got ${typeName(kind)}`);
    switch (kind) {
      case "bytes":
        return this.bytes(obj, here);
      case "set":
        return this.set(obj, here, depth);
      case "dict":
        return new Map(this.pairs(obj, here, depth));
      case "datetime":
        return this.datetime(obj, here);
      case "timedelta":
        return this.timedelta(obj, here, depth);
      case "decimal":
        return this.decimal(obj, here);
      case "complex":
        return new Complex(this.number(obj, "real", here, depth), this.number(obj, "imag", here, depth));
      case "int":
        return this.int(obj, here);
      case "float":
        return this.float(obj, here);
      case "ndarray":
        return this.ndarray(obj, here, depth);
      case "dataframe":
        return this.dataframe(obj, here, depth);
      case "series":
        return this.series(obj, here, depth);
      case "repr":
        return new Repr(
          this.string(obj, "type", here),
          this.string(obj, "repr", here),
          this.field(obj, "truncated", "boolean", here),
          this.string(obj, "why", here),
        );
    }
    return this.fail(at(here, MARK), `unknown form ${JSON.stringify(kind)}`);
  }

  private has(obj: RawObject, name: string, here: Path): unknown {
    if (!Object.hasOwn(obj, name)) this.fail(here, `missing ${JSON.stringify(name)}`);
    return obj[name];
  }

  private field<T extends "string" | "boolean">(obj: RawObject, name: string, kind: T, here: Path): T extends "string" ? string : boolean {
    const found = this.has(obj, name, here);
    if (typeof found !== kind) this.fail(at(here, name), `expected a ${kind}, got ${typeName(found)}`);
    return found as T extends "string" ? string : boolean;
  }

  private string(obj: RawObject, name: string, here: Path): string {
    return this.field(obj, name, "string", here);
  }

  private array(obj: RawObject, name: string, here: Path): unknown[] {
    const found = this.has(obj, name, here);
    if (!Array.isArray(found)) this.fail(at(here, name), `expected an array, got ${typeName(found)}`);
    return found;
  }

  /** Field `name`, an array, decoded as a value the form holds. */
  private sequence(obj: RawObject, name: string, here: Path, depth: number): Value[] {
    this.array(obj, name, here);
    return this.value(obj[name], here, name, depth + 1) as Value[];
  }

  private number(obj: RawObject, name: string, here: Path, depth: number): number {
    const found = this.value(this.has(obj, name, here), here, name, depth + 1);
    if (typeof found === "bigint") {
      const near = Number(found);
      if (!Number.isFinite(near)) this.fail(at(here, name), "a number too large for a float");
      return near;
    }
    if (typeof found !== "number") this.fail(at(here, name), `expected a number, got ${typeName(found)}`);
    return found;
  }

  // Python's hash() refuses these as a dict's key or a set's item.
  private hashable(value: Value, path: Path): void {
    if (Array.isArray(value)) {
      for (const item of value) this.hashable(item, path);
      return;
    }
    const unhashable =
      (value instanceof PySet && !value.frozen) ||
      value instanceof Map ||
      value instanceof NDArray ||
      value instanceof DataFrame ||
      value instanceof Series ||
      (value instanceof Decimal && /^[+-]?snan/i.test(value.value)) ||
      (typeof value === "object" && value !== null && isPlainObject(value));
    if (unhashable) this.fail(path, `an unhashable ${typeName(value)} as a key or set item`);
  }

  private bytes(obj: RawObject, here: Path): Uint8Array {
    const text = this.string(obj, "base64", here);
    if (!isBase64(text)) this.fail(at(here, "base64"), "bad base64");
    const binary = atob(text);
    const out = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
    return out;
  }

  private set(obj: RawObject, here: Path, depth: number): PySet {
    const kind = this.string(obj, "type", here);
    if (kind !== "set" && kind !== "frozenset") this.fail(at(here, "type"), `expected "set" or "frozenset", got ${JSON.stringify(kind)}`);
    const raw = this.array(obj, "items", here);
    const items = at(here, "items");
    const out: Value[] = [];
    for (let i = 0; i < raw.length; i++) {
      const item = this.value(raw[i], items, i, depth + 1);
      this.hashable(item, at(items, i));
      out.push(item);
    }
    return new PySet(out, kind === "frozenset");
  }

  private pairs(obj: RawObject, here: Path, depth: number): [Value, Value][] {
    const raw = this.array(obj, "items", here);
    const items = at(here, "items");
    const out: [Value, Value][] = [];
    for (let i = 0; i < raw.length; i++) {
      const pair = raw[i];
      const there = at(items, i);
      if (!Array.isArray(pair) || pair.length !== 2) this.fail(there, "expected a [key, value] pair");
      const key = this.value(pair[0], there, 0, depth + 1);
      this.hashable(key, at(there, 0));
      out.push([key, this.value(pair[1], there, 1, depth + 1)]);
    }
    return out;
  }

  private datetime(obj: RawObject, here: Path): Value {
    const type = this.string(obj, "type", here);
    const iso = this.string(obj, "iso", here);
    const pandas = type.startsWith("pandas.") && type.endsWith(".Timestamp");
    const bad = (): never => this.fail(at(here, "iso"), `not an ISO ${type}: ${JSON.stringify(iso)}`);
    if (type === "datetime.date") {
      const match = DATE.exec(iso);
      if (match === null) return bad();
      const [year, month, day] = [Number(match[1]), Number(match[2]), Number(match[3])];
      return validDate(year, month, day) ? new PyDate(year, month, day) : bad();
    }
    if (type === "datetime.time") {
      const match = TIME.exec(iso);
      const time = match === null ? null : clock(match, 1, false);
      if (time === null) return bad();
      return new PyTime(time.hour, time.minute, time.second, time.nanosecond, time.offset);
    }
    if (type === "datetime.datetime" || pandas) {
      const match = DATETIME.exec(iso);
      if (match === null) return bad();
      const [year, month, day] = [Number(match[1]), Number(match[2]), Number(match[3])];
      const time = clock(match, 4, pandas);
      if (time === null || !validDate(year, month, day)) return bad();
      return new PyDateTime(type, year, month, day, time.hour, time.minute, time.second, time.nanosecond, time.offset);
    }
    return this.fail(at(here, "type"), `not a date, time or datetime type: ${JSON.stringify(type)}`);
  }

  private timedelta(obj: RawObject, here: Path, depth: number): Timedelta {
    const total = this.number(obj, "seconds", here, depth);
    const bad = (): never => this.fail(at(here, "seconds"), `not a timedelta: ${total}`);
    if (!Number.isFinite(total)) return bad();
    // As Python's timedelta(seconds=x): whole seconds exact, the fraction to the microsecond.
    const whole = Math.trunc(total);
    const micros = BigInt(whole) * 1_000_000n + BigInt(roundHalfEven((total - whole) * 1e6));
    const perDay = 86_400_000_000n;
    let days = micros / perDay;
    let rest = micros % perDay;
    if (rest < 0n) {
      days -= 1n;
      rest += perDay;
    }
    if (days > 999_999_999n || days < -999_999_999n) return bad();
    return new Timedelta(total, Number(days), Number(rest / 1_000_000n), Number(rest % 1_000_000n));
  }

  private decimal(obj: RawObject, here: Path): Decimal {
    const text = this.string(obj, "value", here);
    if (!DECIMAL.test(text)) this.fail(at(here, "value"), `not a decimal: ${JSON.stringify(text)}`);
    return new Decimal(text);
  }

  private int(obj: RawObject, here: Path): bigint {
    const text = this.string(obj, "value", here);
    if (!INT_FORM.test(text) || text.length - (text.startsWith("-") ? 1 : 0) > INT_DIGITS) {
      this.fail(at(here, "value"), `not the decimal digits of an int of at most ${INT_DIGITS}`);
    }
    const value = BigInt(text);
    if (value >= -(2n ** 63n) && value < 2n ** 64n) this.fail(at(here, "value"), "an int within 64 bits comes as a JSON number");
    return value;
  }

  private float(obj: RawObject, here: Path): number {
    const text = this.has(obj, "value", here);
    const value = typeof text === "string" && Object.hasOwn(NON_FINITE, text) ? NON_FINITE[text] : undefined;
    if (value === undefined) this.fail(at(here, "value"), `expected one of nan, inf, -inf, got ${typeof text === "string" ? JSON.stringify(text) : typeName(text)}`);
    return value;
  }

  private ndarray(obj: RawObject, here: Path, depth: number): NDArray {
    const dtypeName = this.string(obj, "dtype", here);
    const shape = this.array(obj, "shape", here);
    shape.forEach((size, i) => {
      if (typeof size !== "number" || !Number.isInteger(size) || size < 0) {
        this.fail(at(at(here, "shape"), i), `expected a size, got ${typeName(size)}`);
      }
    });
    const sizes = shape as number[];
    const data = this.value(this.has(obj, "data", here), here, "data", depth + 1);
    // The path of the cell (or list) at `flat` among those `level` lists deep.
    const cellPath = (flat: number, level: number): Path => {
      const indexes: number[] = [];
      for (let d = level - 1; d >= 0; d--) {
        const size = sizes[d] ?? 1;
        indexes.push(flat % size);
        flat = Math.floor(flat / size);
      }
      return indexes.reverse().reduce<Path>((path, i) => at(path, i), at(here, "data"));
    };
    // The cells, checked level by level against the shape (a 0-d array's data is its cell).
    let cells: Value[] = [data];
    sizes.forEach((size, level) => {
      const inner: Value[] = [];
      cells.forEach((item, k) => {
        if (!Array.isArray(item) || item.length !== size) {
          this.fail(cellPath(k, level), `does not match shape [${sizes.join(", ")}]: expected a list of ${size}`);
        }
        for (const cell of item) inner.push(cell);
      });
      cells = inner;
    });
    const dtype = parseDType(dtypeName);
    if (dtype === null) this.fail(at(here, "dtype"), `not a numpy dtype: ${JSON.stringify(dtypeName)}`);
    if (cells.length * dtype.size > MAX_ARRAY_BYTES) {
      this.fail(at(here, "dtype"), `${cells.length} cells of ${dtypeName} exceed ${MAX_ARRAY_BYTES} bytes`);
    }
    const bounds = INT_BOUNDS[dtype.kind + dtype.size];
    const Typed = TYPED[dtype.kind + dtype.size] ?? (dtype.kind === "f" ? Float64Array : undefined);
    const out: NDArrayData = Typed === undefined ? new Array<Value>(cells.length) : new Typed(cells.length);
    cells.forEach((cell, i) => {
      const fits = this.cell(cell, dtype, bounds);
      if (fits !== true) this.fail(cellPath(i, sizes.length), fits);
      if (out instanceof BigInt64Array || out instanceof BigUint64Array) out[i] = BigInt(cell as number | bigint);
      else if (!Array.isArray(out)) out[i] = Number(cell);
      else if (dtype.kind === "c" && !(cell instanceof Complex)) out[i] = new Complex(Number(cell), 0);
      else out[i] = cell;
    });
    if (sizes.length > MAX_DIMS) this.fail(at(here, "shape"), `more than ${MAX_DIMS} dimensions`);
    return new NDArray(dtypeName, sizes, out);
  }

  // Whether `cell` is what numpy's tolist() gives for the dtype (numpy itself would quietly
  // turn "3" or 3.7 into an int64 3), or why not.
  private cell(cell: Value, dtype: DType, bounds: readonly [bigint, bigint] | undefined): true | string {
    const wrong = `a ${typeName(cell)} in an array of kind "${dtype.kind}"`;
    switch (dtype.kind) {
      case "b":
        return typeof cell === "boolean" || wrong;
      case "i":
      case "u": {
        const int = typeof cell === "bigint" ? cell : typeof cell === "number" && Number.isInteger(cell) ? BigInt(cell) : null;
        if (int === null || bounds === undefined) return wrong;
        return (int >= bounds[0] && int <= bounds[1]) || `${int} does not fit ${dtype.kind}${dtype.size * 8}`;
      }
      case "f":
        if (typeof cell === "bigint") return Number.isFinite(Number(cell)) || `${cell} does not fit a float`;
        return typeof cell === "number" || wrong;
      case "c":
        return typeof cell === "number" || typeof cell === "bigint" || cell instanceof Complex || wrong;
      case "U":
        return typeof cell === "string" || wrong;
      case "S":
      case "V":
        return cell instanceof Uint8Array || wrong;
      case "M":
        return cell === null || cell instanceof PyDate || cell instanceof PyDateTime || (typeof cell === "number" && Number.isInteger(cell)) || typeof cell === "bigint" || wrong;
      case "m":
        return cell === null || cell instanceof Timedelta || (typeof cell === "number" && Number.isInteger(cell)) || typeof cell === "bigint" || wrong;
    }
    return true;
  }

  private dataframe(obj: RawObject, here: Path, depth: number): DataFrame {
    const columns = this.sequence(obj, "columns", here, depth);
    const index = this.sequence(obj, "index", here, depth);
    const records = this.sequence(obj, "records", here, depth);
    const at_records = at(here, "records");
    records.forEach((record, i) => {
      if (!(record instanceof Map) && !(typeof record === "object" && record !== null && isPlainObject(record))) {
        this.fail(at(at_records, i), `expected an object, got ${typeName(record)}`);
      }
    });
    if (records.length !== index.length) this.fail(at_records, `${records.length} records for an index of ${index.length}`);
    const rows = this.rows(columns, records as (JsonObject | Map<Value, Value>)[], at_records);
    let dtypes: string[] | null = null;
    if (Object.hasOwn(obj, "dtypes")) {
      dtypes = this.sequence(obj, "dtypes", here, depth) as string[];
      dtypes.forEach((dtype, i) => {
        if (typeof dtype !== "string") this.fail(at(at(here, "dtypes"), i), `expected a string, got ${typeName(dtype)}`);
      });
      if (dtypes.length !== columns.length) this.fail(at(here, "dtypes"), `${dtypes.length} dtypes for ${columns.length} columns`);
    }
    return new DataFrame(columns, index, dtypes, rows);
  }

  // Each record's cells in the columns' order; a record holds exactly the columns' labels
  // (pandas keeps one value of a label that is there twice).
  private rows(columns: Value[], records: (JsonObject | Map<Value, Value>)[], path: Path): Value[][] {
    const named = columns.every((label) => typeof label === "string");
    const labels = named ? null : columns.map(labelKey);
    const distinct = new Set(labels ?? columns).size;
    return records.map((record, i) => {
      const bad = (): never => this.fail(at(path, i), "keys that are not the columns' labels");
      if (record instanceof Map) {
        const cells = new Map<string, Value>();
        for (const [key, cell] of record) cells.set(labelKey(key), cell);
        const keys = labels ?? columns.map(labelKey);
        if (cells.size !== distinct || !keys.every((key) => cells.has(key))) return bad();
        return keys.map((key) => cells.get(key) as Value);
      }
      if (!named || Object.keys(record).length !== distinct) return bad();
      const row = new Array<Value>(columns.length);
      for (let j = 0; j < columns.length; j++) {
        const label = columns[j] as string;
        if (!Object.hasOwn(record, label)) return bad();
        row[j] = record[label] as Value;
      }
      return row;
    });
  }

  private series(obj: RawObject, here: Path, depth: number): Series {
    const name = this.value(this.has(obj, "name", here), here, "name", depth + 1);
    const index = this.sequence(obj, "index", here, depth);
    const data = this.sequence(obj, "data", here, depth);
    if (data.length !== index.length) this.fail(at(here, "data"), `${data.length} values for an index of ${index.length}`);
    return new Series(name, index, data);
  }
}
