// The values an execution's result decodes to (README: "What comes back"): plain JSON as
// itself, and each form airlock marks with "$airlock" as the type below. Every class keeps
// what was sent exactly; conversions to lossier JavaScript types are methods that say what
// they drop.

/**
 * A decoded value. Narrow it with `typeof`, `Array.isArray`, `instanceof` or {@link kindOf}:
 *
 * | sent | decoded |
 * |---|---|
 * | `null`, `true`/`false`, a string | itself |
 * | an integer within ±(2^53 - 1), a finite float | a `number` (an integral float such as `2.0` is the number 2) |
 * | an integer past ±(2^53 - 1) (JSON carries -2^63..2^64 - 1) and every `"int"` form | a `bigint` |
 * | `"float"` form (NaN, ±infinity) | the `number` NaN, `Infinity`, `-Infinity` |
 * | an array (a Python list or tuple) | an `Array` of values |
 * | an object (a dict with string keys) | a plain object ({@link JsonObject}); its integer-like keys iterate first, as in every JavaScript object |
 * | `"bytes"` | a `Uint8Array` |
 * | `"set"` | a {@link PySet} (a `Set` that says whether it was a frozenset) |
 * | `"dict"` (other keys) | a `Map`: keys that are primitives (numbers, bigints, strings, booleans, null) are found with `get()`; tuples (arrays) and other objects only by iterating |
 * | `"datetime"` | a {@link PyDate}, {@link PyDateTime} or {@link PyTime} |
 * | `"timedelta"`, `"decimal"`, `"complex"` | a {@link Timedelta}, {@link Decimal}, {@link Complex} |
 * | `"ndarray"`, `"dataframe"`, `"series"` | an {@link NDArray}, {@link DataFrame}, {@link Series} |
 * | `"repr"` | a {@link Repr}: text to read, never to evaluate |
 */
export type Value =
  | null
  | boolean
  | number
  | bigint
  | string
  | Value[]
  | JsonObject
  | Uint8Array
  | PySet
  | Map<Value, Value>
  | PyDate
  | PyDateTime
  | PyTime
  | Timedelta
  | Decimal
  | Complex
  | NDArray
  | DataFrame
  | Series
  | Repr;

/** A JSON object as decoded: a plain object whose keys are the dict's string keys. */
export interface JsonObject {
  [key: string]: Value;
}

/** The name of a decoded value's kind, one per member of {@link Value}. */
export type ValueKind =
  | "null"
  | "boolean"
  | "number"
  | "bigint"
  | "string"
  | "list"
  | "object"
  | "bytes"
  | "set"
  | "dict"
  | "date"
  | "datetime"
  | "time"
  | "timedelta"
  | "decimal"
  | "complex"
  | "ndarray"
  | "dataframe"
  | "series"
  | "repr";

/** Which member of {@link Value} `value` is, for a `switch` over every kind. */
export function kindOf(value: Value): ValueKind {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean":
    case "number":
    case "bigint":
    case "string":
      return typeof value as "boolean" | "number" | "bigint" | "string";
  }
  if (Array.isArray(value)) return "list";
  if (value instanceof Uint8Array) return "bytes";
  if (value instanceof PySet) return "set";
  if (value instanceof Map) return "dict";
  if (value instanceof PyDate) return "date";
  if (value instanceof PyDateTime) return "datetime";
  if (value instanceof PyTime) return "time";
  if (value instanceof Timedelta) return "timedelta";
  if (value instanceof Decimal) return "decimal";
  if (value instanceof Complex) return "complex";
  if (value instanceof NDArray) return "ndarray";
  if (value instanceof DataFrame) return "dataframe";
  if (value instanceof Series) return "series";
  if (value instanceof Repr) return "repr";
  return "object";
}

/** A Python `set` or `frozenset`. Its items are compared as JavaScript's `Set` does: by value
 * for primitives, by identity for arrays (tuples) and objects. */
export class PySet extends Set<Value> {
  /** Whether it was a `frozenset`. */
  readonly frozen: boolean;

  /** A set of `items` (a `frozenset` when `frozen`). */
  constructor(items: Iterable<Value>, frozen: boolean) {
    super(items);
    this.frozen = frozen;
  }
}

const pad = (n: number, width: number): string => String(n).padStart(width, "0");

/** A UTC offset in seconds as Python's isoformat() writes it: `+HH:MM[:SS[.ffffff]]`. */
function offsetText(offset: number | null): string {
  if (offset === null) return "";
  const micros = Math.round(Math.abs(offset) * 1e6);
  const seconds = Math.floor(micros / 1e6);
  const fraction = micros % 1e6;
  let text = `${offset < 0 ? "-" : "+"}${pad(Math.floor(seconds / 3600), 2)}:${pad(Math.floor(seconds / 60) % 60, 2)}`;
  if (seconds % 60 || fraction) text += `:${pad(seconds % 60, 2)}`;
  if (fraction) text += `.${pad(fraction, 6)}`;
  return text;
}

/** A `datetime.date`. */
export class PyDate {
  /** The date of `year` (1-9999), `month` (1-12), `day`. */
  constructor(
    readonly year: number,
    readonly month: number,
    readonly day: number,
  ) {}

  /** `YYYY-MM-DD`, as Python's isoformat(). */
  toString(): string {
    return `${pad(this.year, 4)}-${pad(this.month, 2)}-${pad(this.day, 2)}`;
  }

  /** Midnight UTC of this date as a JavaScript `Date` (exact). */
  toDate(): Date {
    const date = new Date(0);
    date.setUTCFullYear(this.year, this.month - 1, this.day);
    return date;
  }
}

/** A `datetime.datetime` or a pandas `Timestamp`, every digit kept: nanoseconds (a
 * `Timestamp`'s) and the UTC offset, or none for a naive one. */
export class PyDateTime {
  constructor(
    /** The Python type sent: `"datetime.datetime"` or pandas' `Timestamp`'s full name. */
    readonly type: string,
    readonly year: number,
    readonly month: number,
    readonly day: number,
    readonly hour: number,
    readonly minute: number,
    readonly second: number,
    /** Within the second, 0-999999999 (a `datetime`'s microseconds times 1000). */
    readonly nanosecond: number,
    /** Seconds east of UTC (fractional where Python's offset had microseconds), or null for a
     * naive datetime. */
    readonly utcOffset: number | null,
  ) {}

  /** Python's isoformat() of it (nanoseconds written where there are any). */
  toString(): string {
    const date = new PyDate(this.year, this.month, this.day).toString();
    return `${date}T${clockText(this.hour, this.minute, this.second, this.nanosecond)}${offsetText(this.utcOffset)}`;
  }

  /** Nanoseconds since 1970-01-01 UTC, exactly; a naive datetime is read as UTC. */
  epochNanoseconds(): bigint {
    const midnight = BigInt(new PyDate(this.year, this.month, this.day).toDate().getTime()) * 1_000_000n;
    const clock = BigInt(this.hour * 3600 + this.minute * 60 + this.second) * 1_000_000_000n + BigInt(this.nanosecond);
    const offset = BigInt(Math.round((this.utcOffset ?? 0) * 1e6)) * 1000n;
    return midnight + clock - offset;
  }

  /** This instant as a JavaScript `Date`, which keeps milliseconds only: the microseconds and
   * nanoseconds below them are dropped (toward the past), and so is the offset (a `Date` is
   * an instant); a naive datetime is read as UTC. */
  toDate(): Date {
    const nanos = this.epochNanoseconds();
    const millis = nanos / 1_000_000n - (nanos % 1_000_000n < 0n ? 1n : 0n);
    return new Date(Number(millis));
  }
}

function clockText(hour: number, minute: number, second: number, nanosecond: number): string {
  let text = `${pad(hour, 2)}:${pad(minute, 2)}:${pad(second, 2)}`;
  if (nanosecond % 1000) text += `.${pad(nanosecond, 9)}`;
  else if (nanosecond) text += `.${pad(nanosecond / 1000, 6)}`;
  return text;
}

/** A `datetime.time`, with its UTC offset if it had one. It has no `toDate()`: it is no
 * instant. */
export class PyTime {
  constructor(
    readonly hour: number,
    readonly minute: number,
    readonly second: number,
    /** Within the second, 0-999999999 (Python's microseconds times 1000). */
    readonly nanosecond: number,
    /** Seconds east of UTC, or null. */
    readonly utcOffset: number | null,
  ) {}

  /** Python's isoformat() of it. */
  toString(): string {
    return clockText(this.hour, this.minute, this.second, this.nanosecond) + offsetText(this.utcOffset);
  }
}

/** A `datetime.timedelta`. The sandbox sends its `total_seconds()`, a float; `days`,
 * `seconds` and `microseconds` are what Python makes of that float (rounded to the
 * microsecond, `seconds` and `microseconds` never negative). */
export class Timedelta {
  constructor(
    /** The seconds as sent. */
    readonly totalSeconds: number,
    /** -999999999 to 999999999. */
    readonly days: number,
    /** 0-86399. */
    readonly seconds: number,
    /** 0-999999. */
    readonly microseconds: number,
  ) {}

  /** The whole span in microseconds, exactly. */
  totalMicroseconds(): bigint {
    return (BigInt(this.days) * 86_400n + BigInt(this.seconds)) * 1_000_000n + BigInt(this.microseconds);
  }

  /** The span in milliseconds as a number (for `Date` arithmetic): exact below 2^53 ms. */
  toMilliseconds(): number {
    return (this.days * 86_400 + this.seconds) * 1000 + this.microseconds / 1000;
  }
}

/** A `decimal.Decimal`, as its exact text (`"1.10"`, `"-1E+3"`, `"NaN"`, `"sNaN"`,
 * `"-Infinity"`): JavaScript has no decimal type, and a number would lose digits. */
export class Decimal {
  /** The decimal whose text is `value` (Python's `str()` of it). */
  constructor(readonly value: string) {}

  /** Its text, every digit as sent. */
  toString(): string {
    return this.value;
  }

  /** The nearest `number` (digits past a double's 15-17 are lost; `"sNaN"` is NaN). */
  toNumber(): number {
    return Number(this.value.replace(/^([+-]?)s?nan\d*$/i, "NaN").replace(/^([+-]?)inf(inity)?$/i, "$1Infinity"));
  }
}

/** A `complex`: two floats. */
export class Complex {
  constructor(
    readonly real: number,
    readonly imag: number,
  ) {}
}

/** The storage of an {@link NDArray}'s cells, flat, in C order. */
export type NDArrayData =
  | Int8Array
  | Int16Array
  | Int32Array
  | Uint8Array
  | Uint16Array
  | Uint32Array
  | BigInt64Array
  | BigUint64Array
  | Float32Array
  | Float64Array
  | Value[];

/**
 * A numpy array: its dtype as numpy names it (`str(dtype)`), its shape, and its cells, flat in
 * C (row-major) order, in the storage that holds them exactly: int8-int32 and uint8-uint32 in
 * the typed array of that width, int64 and uint64 in a `BigInt64Array`/`BigUint64Array`,
 * float32 in a `Float32Array`, float16/float64/longdouble in a `Float64Array` (the sandbox
 * sends a longdouble's nearest double); any other dtype in an `Array` of values: bool
 * `boolean`s, complex {@link Complex}es, `<U` strings, `|S`/`|V` `Uint8Array`s, datetime64 a
 * {@link PyDate}/{@link PyDateTime}, `bigint`/`number` or null (NaT), timedelta64 a
 * {@link Timedelta}, a number or null, object anything.
 */
export class NDArray {
  constructor(
    readonly dtype: string,
    readonly shape: readonly number[],
    readonly data: NDArrayData,
  ) {}

  /** How many cells. */
  get size(): number {
    return this.data.length;
  }

  /** The cell at `index` (one index per dimension; none for a 0-d array). */
  at(...index: number[]): Value {
    if (index.length !== this.shape.length) throw new RangeError(`${this.shape.length} indexes needed`);
    let flat = 0;
    index.forEach((i, d) => {
      const size = this.shape[d] ?? 0;
      if (!Number.isInteger(i) || i < 0 || i >= size) throw new RangeError(`index ${i} out of 0..${size - 1}`);
      flat = flat * size + i;
    });
    return this.data[flat] as Value;
  }

  /** The cells nested by the shape, as numpy's `tolist()` (a 0-d array gives its one cell). */
  toNested(): Value {
    const cells = Array.from(this.data as ArrayLike<Value>);
    const nest = (level: number, start: number, stride: number): Value => {
      if (level === this.shape.length) return cells[start] as Value;
      const size = this.shape[level] ?? 0;
      const inner = size ? stride / size : 0;
      const out: Value[] = [];
      for (let i = 0; i < size; i++) out.push(nest(level + 1, start + i * inner, inner));
      return out;
    };
    return nest(0, 0, cells.length);
  }
}

/** A pandas `DataFrame`: a table of `rows`, each with one cell per column, in the order of
 * `columns`. Column and index labels are values (a MultiIndex's labels are arrays). */
export class DataFrame {
  constructor(
    /** The column labels, in order (a label may appear twice). */
    readonly columns: readonly Value[],
    /** The index labels, one per row. */
    readonly index: readonly Value[],
    /** Each column's dtype as pandas names it (`"int64"`, `"object"`, `"category"`,
     * `"datetime64[ns]"`), one per column; null from a server older than them. */
    readonly dtypes: readonly string[] | null,
    /** The cells, row by row; `rows[i][j]` is in column `columns[j]`. */
    readonly rows: readonly (readonly Value[])[],
  ) {}

  /** The cells of the column at `position`, top to bottom. */
  column(position: number): Value[] {
    if (!Number.isInteger(position) || position < 0 || position >= this.columns.length) {
      throw new RangeError(`no column at ${position}`);
    }
    return this.rows.map((row) => row[position] as Value);
  }
}

/** A pandas `Series`: its name, index labels and values. */
export class Series {
  constructor(
    readonly name: Value,
    readonly index: readonly Value[],
    readonly data: readonly Value[],
  ) {}
}

/** A value JSON cannot carry, as the sandbox's `repr()` of it: text to read, never to
 * evaluate. Frozen. */
export class Repr {
  constructor(
    /** The value's Python type, as `module.qualname`. */
    readonly type: string,
    /** Its repr, at most 4096 characters. */
    readonly repr: string,
    /** Whether the repr was cut. */
    readonly truncated: boolean,
    /** Why it came as a repr (`"not a JSON value"`, `"array of more than 100000 cells"`...). */
    readonly why: string,
  ) {
    Object.freeze(this);
  }

  /** The repr text. */
  toString(): string {
    return this.repr;
  }
}
