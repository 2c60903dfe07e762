import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import {
  Complex,
  DataFrame,
  Decimal,
  decode,
  DecodeError,
  kindOf,
  NDArray,
  parseJson,
  PyDate,
  PyDateTime,
  PySet,
  PyTime,
  Repr,
  Series,
  Timedelta,
  type Value,
} from "../src/index.js";

// The table the Python client's tests read too (its "notation" says how to read `value`).
type Entry = { json: string; value: unknown };
type Refusal = { json: string; path: string };
const TABLE = JSON.parse(readFileSync(new URL("../../../forms.json", import.meta.url), "utf8")) as {
  forms: Entry[];
  ndarrays: Entry[];
  malformed: Refusal[];
  malformed_cells: Refusal[];
};

const hex = (bytes: Uint8Array): string => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

function isPlain(value: unknown): boolean {
  return typeof value === "object" && value !== null && Object.getPrototypeOf(value) === Object.prototype;
}

/** Asserts that `got` is the value `notation` stands for, of the same types all the way down. */
function check(got: Value, notation: unknown, where = "$"): void {
  const fail = (what: string): never => assert.fail(`${where}: ${what}, got ${String(got)} (${kindOf(got)})`);
  if (notation === null || typeof notation === "boolean" || typeof notation === "string") {
    if (got !== notation) fail(`expected ${JSON.stringify(notation)}`);
    return;
  }
  if (typeof notation === "number") {
    assert.ok(Number.isSafeInteger(notation) || !Number.isInteger(notation) || Object.is(notation, -0) || Math.abs(notation) > 2 ** 53, where);
    if (typeof got !== "number" || !Object.is(got, notation)) fail(`expected the number ${notation}`);
    return;
  }
  if (Array.isArray(notation)) {
    if (!Array.isArray(got) || got.length !== notation.length) return fail(`expected a list of ${notation.length}`);
    got.forEach((item, i) => check(item, notation[i], `${where}[${i}]`));
    return;
  }
  const entries = Object.entries(notation as object);
  assert.equal(entries.length, 1, `${where}: notation ${JSON.stringify(notation)}`);
  const [tag, body] = entries[0] as [string, unknown];
  const list = body as unknown[];
  switch (tag) {
    case "object": {
      if (!isPlain(got)) return fail("expected a plain object");
      const object = got as Record<string, Value>;
      assert.deepEqual(Object.keys(object), Object.keys(body as object), where);
      for (const [key, item] of Object.entries(body as object)) check(object[key] as Value, item, `${where}.${key}`);
      return;
    }
    case "tuple":
      return check(got, body, where);
    case "int": {
      const want = BigInt(body as string);
      assert.ok(!Number.isSafeInteger(Number(want)), `${where}: a safe int in the table as {"int"}`);
      if (got !== want) fail(`expected the bigint ${want}`);
      return;
    }
    case "float": {
      const want = ({ nan: NaN, inf: Infinity, "-inf": -Infinity } as Record<string, number>)[body as string];
      if (typeof got !== "number" || !Object.is(got, want)) fail(`expected ${body}`);
      return;
    }
    case "bytes":
      if (!(got instanceof Uint8Array) || hex(got) !== body) fail(`expected bytes ${body}`);
      return;
    case "set":
    case "frozenset": {
      if (!(got instanceof PySet) || got.frozen !== (tag === "frozenset") || got.size !== list.length) return fail(`expected a ${tag} of ${list.length}`);
      [...got].forEach((item, i) => check(item, list[i], `${where}.items[${i}]`));
      return;
    }
    case "dict": {
      if (!(got instanceof Map) || got.size !== list.length) return fail(`expected a Map of ${list.length}`);
      [...got].forEach(([key, item], i) => {
        const [wantKey, wantItem] = list[i] as [unknown, unknown];
        check(key, wantKey, `${where}.items[${i}][0]`);
        check(item, wantItem, `${where}.items[${i}][1]`);
      });
      return;
    }
    case "date":
      if (!(got instanceof PyDate)) return fail("expected a PyDate");
      assert.deepEqual([got.year, got.month, got.day], body, where);
      return;
    case "datetime":
      if (!(got instanceof PyDateTime)) return fail("expected a PyDateTime");
      assert.deepEqual([got.year, got.month, got.day, got.hour, got.minute, got.second, got.nanosecond, got.utcOffset], body, where);
      return;
    case "time":
      if (!(got instanceof PyTime)) return fail("expected a PyTime");
      assert.deepEqual([got.hour, got.minute, got.second, got.nanosecond, got.utcOffset], body, where);
      return;
    case "timedelta":
      if (!(got instanceof Timedelta)) return fail("expected a Timedelta");
      assert.deepEqual([got.days, got.seconds, got.microseconds], body, where);
      return;
    case "decimal":
      if (!(got instanceof Decimal) || got.value !== body) fail(`expected the decimal ${body}`);
      return;
    case "complex":
      if (!(got instanceof Complex)) return fail("expected a Complex");
      check(got.real, list[0], `${where}.real`);
      check(got.imag, list[1], `${where}.imag`);
      return;
    case "repr":
      if (!(got instanceof Repr)) return fail("expected a Repr");
      assert.deepEqual([got.type, got.repr, got.truncated, got.why], body, where);
      return;
    case "dataframe": {
      const want = body as { columns: unknown[]; index: unknown[]; dtypes: string[] | null; rows: unknown[] };
      if (!(got instanceof DataFrame)) return fail("expected a DataFrame");
      check([...got.columns], want.columns, `${where}.columns`);
      check([...got.index], want.index, `${where}.index`);
      assert.deepEqual(got.dtypes, want.dtypes, `${where}.dtypes`);
      check(got.rows.map((row) => [...row]), want.rows, `${where}.rows`);
      return;
    }
    case "series": {
      const want = body as { name: unknown; index: unknown[]; data: unknown[] };
      if (!(got instanceof Series)) return fail("expected a Series");
      check(got.name, want.name, `${where}.name`);
      check([...got.index], want.index, `${where}.index`);
      check([...got.data], want.data, `${where}.data`);
      return;
    }
    case "ndarray": {
      const want = body as { dtype: string; shape: number[]; data: unknown };
      if (!(got instanceof NDArray)) return fail("expected an NDArray");
      assert.equal(got.dtype, want.dtype, where);
      assert.deepEqual(got.shape, want.shape, where);
      if (got.data instanceof BigInt64Array || got.data instanceof BigUint64Array) {
        // An int64's cells are bigints, small or not.
        const flat = (cells: unknown): unknown[] => (Array.isArray(cells) ? cells.flatMap(flat) : [cells]);
        const cells = flat(want.data).map((cell) => BigInt(typeof cell === "number" ? cell : (cell as { int: string }).int));
        assert.deepEqual([...got.data], cells, where);
        return;
      }
      check(got.toNested(), want.data, `${where}.data`);
      return;
    }
  }
  assert.fail(`${where}: unknown notation ${tag}`);
}

function refusal(raw: unknown, options = {}): DecodeError {
  try {
    decode(raw, options);
  } catch (e) {
    assert.ok(e instanceof DecodeError, String(e));
    assert.ok(e.message.startsWith(`${e.path}: `) && e.reason.length > 0, e.message);
    return e;
  }
  return assert.fail(`accepted ${String(raw)}`);
}

describe("the table of forms (clients/forms.json)", () => {
  test("is read", () => {
    assert.ok(TABLE.forms.length >= 45 && TABLE.ndarrays.length >= 12);
    assert.ok(TABLE.malformed.length >= 90 && TABLE.malformed_cells.length >= 16);
  });
  for (const [i, entry] of [...TABLE.forms, ...TABLE.ndarrays].entries()) {
    test(`decodes form ${i}: ${entry.json.slice(0, 80)}`, () => {
      check(decode(parseJson(entry.json)), entry.value);
    });
  }
  for (const entry of [...TABLE.malformed, ...TABLE.malformed_cells]) {
    test(`refuses at ${entry.path}: ${entry.json.slice(0, 80)}`, () => {
      assert.equal(refusal(parseJson(entry.json)).path, entry.path);
    });
  }
});

describe("decode", () => {
  test("NaN is the number NaN", () => {
    const got = decode([{ $airlock: "float", value: "nan" }]);
    assert.ok(Array.isArray(got) && typeof got[0] === "number" && Number.isNaN(got[0]));
  });

  test("what JSON text cannot hold is refused, with its path", () => {
    const cases: [unknown, string][] = [
      [[undefined], "$[0]"],
      [{ x: NaN }, "$.x"],
      [[Infinity], "$[0]"],
      [[new Map()], "$[0]"],
      [{ a: [new Date(0)] }, "$.a[0]"],
      [[() => 1], "$[0]"],
      [[Symbol("s")], "$[0]"],
      [{ "a b": [1, new Set()] }, '$["a b"][1]'],
      [{ é: { "é ": undefined } }, '$.é["\\u00e9 "]'],
      [{ $airlock: "float", value: NaN }, "$.value"],
    ];
    for (const [raw, path] of cases) assert.equal(refusal(raw).path, path);
  });

  test("a plain object's __proto__ key is its own property, not its prototype", () => {
    const got = decode(parseJson('{"__proto__": {"polluted": 1}}')) as Record<string, Value>;
    assert.equal(Object.getPrototypeOf(got), Object.prototype);
    assert.ok(Object.hasOwn(got, "__proto__") && !("polluted" in got));
    assert.equal(({} as Record<string, unknown>)["polluted"], undefined);
  });

  test("ints past 2^53 are bigints wherever they sit; smaller ones numbers", () => {
    const text = '{"a": [18446744073709551615, -9223372036854775808, 9007199254740991, -9007199254740992], "b": {"$airlock": "dict", "items": [[9007199254740993, 1]]}}';
    const got = decode(parseJson(text)) as { a: Value[]; b: Map<Value, Value> };
    assert.deepEqual(got.a, [18446744073709551615n, -9223372036854775808n, 9007199254740991, -9007199254740992n]);
    assert.equal(got.b.get(9007199254740993n), 1);
    // JSON.parse's lossy numbers still decode (to the numbers JSON.parse made of them).
    assert.deepEqual(decode(JSON.parse('[18446744073709551615]')), [18446744073709552000]);
  });

  test("an array's cells are in the storage that holds its dtype exactly", () => {
    const array = (dtype: string, data: unknown[]): NDArray => {
      const got = decode({ $airlock: "ndarray", dtype, shape: [data.length], data });
      assert.ok(got instanceof NDArray);
      return got;
    };
    const int64 = array("int64", [1, -(2n ** 63n), 2n ** 63n - 1n]);
    assert.ok(int64.data instanceof BigInt64Array);
    assert.deepEqual([...int64.data], [1n, -(2n ** 63n), 2n ** 63n - 1n]);
    assert.ok(array("uint64", [2n ** 64n - 1n]).data instanceof BigUint64Array);
    assert.ok(array("int8", [-128]).data instanceof Int8Array);
    assert.ok(array("uint32", [4294967295]).data instanceof Uint32Array);
    const f32 = array("float32", [0.1, { $airlock: "float", value: "nan" }]);
    assert.ok(f32.data instanceof Float32Array && f32.data[0] === Math.fround(0.1) && Number.isNaN(f32.data[1]));
    assert.ok(array("float64", [0.1]).data instanceof Float64Array);
    assert.deepEqual(array("bool", [true, false]).data, [true, false]);
    const complex = array("complex128", [{ $airlock: "complex", real: 1, imag: -1 }, 2]);
    assert.deepEqual(complex.data, [new Complex(1, -1), new Complex(2, 0)]);

    const grid = decode({ $airlock: "ndarray", dtype: "int32", shape: [2, 3], data: [[1, 2, 3], [4, 5, 6]] });
    assert.ok(grid instanceof NDArray && grid.data instanceof Int32Array);
    assert.equal(grid.size, 6);
    assert.equal(grid.at(1, 2), 6);
    assert.deepEqual(grid.toNested(), [[1, 2, 3], [4, 5, 6]]);
    assert.throws(() => grid.at(2, 0), RangeError);
    const scalar = decode({ $airlock: "ndarray", dtype: "float64", shape: [], data: 0.25 });
    assert.ok(scalar instanceof NDArray && scalar.at() === 0.25 && scalar.toNested() === 0.25);
    const empty = decode({ $airlock: "ndarray", dtype: "int64", shape: [0, 3], data: [] });
    assert.ok(empty instanceof NDArray && empty.size === 0);
    assert.deepEqual(empty.toNested(), []);
  });

  test("a table's rows follow its columns, whatever the records' order", () => {
    const got = decode({
      $airlock: "dataframe",
      columns: [[1, "x"], null],
      index: ["r", "s"],
      dtypes: ["int64", "object"],
      records: [
        { $airlock: "dict", items: [[null, "a"], [[1, "x"], 1]] },
        { $airlock: "dict", items: [[[1, "x"], 2], [null, "b"]] },
      ],
    });
    assert.ok(got instanceof DataFrame);
    assert.deepEqual(got.rows, [[1, "a"], [2, "b"]]);
    assert.deepEqual(got.column(1), ["a", "b"]);
    assert.deepEqual(got.dtypes, ["int64", "object"]);
    assert.throws(() => got.column(2), RangeError);
  });

  test("dates and times keep every digit; toDate() says what it drops", () => {
    const form = (type: string, iso: string): Value => decode({ $airlock: "datetime", type, iso });
    const stamp = form("pandas._libs.tslibs.timestamps.Timestamp", "2024-01-02T03:04:05.123456789+01:00");
    assert.ok(stamp instanceof PyDateTime);
    assert.equal(stamp.nanosecond, 123456789);
    assert.equal(stamp.toString(), "2024-01-02T03:04:05.123456789+01:00");
    assert.equal(stamp.epochNanoseconds(), BigInt(Date.UTC(2024, 0, 2, 2, 4, 5)) * 1_000_000n + 123456789n);
    assert.equal(stamp.toDate().toISOString(), "2024-01-02T02:04:05.123Z");
    const naive = form("datetime.datetime", "1969-12-31T23:59:59.999999");
    assert.ok(naive instanceof PyDateTime && naive.utcOffset === null);
    assert.equal(naive.toDate().getTime(), -1); // read as UTC, the microseconds dropped toward the past
    assert.equal(naive.toString(), "1969-12-31T23:59:59.999999");
    const date = form("datetime.date", "0099-03-01");
    assert.ok(date instanceof PyDate);
    assert.equal(date.toDate().toISOString(), "0099-03-01T00:00:00.000Z");
    assert.equal(date.toString(), "0099-03-01");
    const time = form("datetime.time", "23:59:59.000001-05:30:15");
    assert.ok(time instanceof PyTime);
    assert.equal(time.utcOffset, -(5 * 3600 + 30 * 60 + 15));
    assert.equal(time.toString(), "23:59:59.000001-05:30:15");
    // Nine digits of a second are a pandas Timestamp's, not a datetime's.
    assert.equal(refusal({ $airlock: "datetime", type: "datetime.datetime", iso: "2024-01-02T03:04:05.123456789" }).path, "$.iso");
  });

  test("timedeltas, decimals and reprs", () => {
    const delta = decode({ $airlock: "timedelta", seconds: -1.5 });
    assert.ok(delta instanceof Timedelta);
    assert.deepEqual([delta.totalSeconds, delta.days, delta.seconds, delta.microseconds], [-1.5, -1, 86398, 500000]);
    assert.equal(delta.totalMicroseconds(), -1_500_000n);
    assert.equal(delta.toMilliseconds(), -1500);
    const decimal = decode({ $airlock: "decimal", value: "1.10" });
    assert.ok(decimal instanceof Decimal);
    assert.equal(String(decimal), "1.10");
    assert.equal(decimal.toNumber(), 1.1);
    assert.equal(new Decimal("-Infinity").toNumber(), -Infinity);
    assert.ok(Number.isNaN(new Decimal("sNaN12").toNumber()));
    const repr = decode({ $airlock: "repr", type: "t", repr: "__import__('os')", truncated: false, why: "w" });
    assert.ok(repr instanceof Repr && Object.isFrozen(repr));
    assert.equal(String(repr), "__import__('os')");
    assert.throws(() => {
      (repr as { repr: string }).repr = "changed";
    }, TypeError);
  });

  test("kindOf names each kind", () => {
    const form = '[null, true, 1, 18446744073709551615, "s", [], {}, {"$airlock": "bytes", "base64": ""},'
      + ' {"$airlock": "set", "type": "set", "items": []}, {"$airlock": "dict", "items": []},'
      + ' {"$airlock": "datetime", "type": "datetime.date", "iso": "2024-01-02"},'
      + ' {"$airlock": "datetime", "type": "datetime.datetime", "iso": "2024-01-02T00:00:00"},'
      + ' {"$airlock": "datetime", "type": "datetime.time", "iso": "00:00:00"},'
      + ' {"$airlock": "timedelta", "seconds": 1}, {"$airlock": "decimal", "value": "1"},'
      + ' {"$airlock": "complex", "real": 1, "imag": 1}, {"$airlock": "ndarray", "dtype": "int64", "shape": [], "data": 1},'
      + ' {"$airlock": "dataframe", "columns": [], "index": [], "records": []},'
      + ' {"$airlock": "series", "name": null, "index": [], "data": []},'
      + ' {"$airlock": "repr", "type": "t", "repr": "r", "truncated": false, "why": "w"}]';
    assert.deepEqual((decode(parseJson(form)) as Value[]).map(kindOf), [
      "null", "boolean", "number", "bigint", "string", "list", "object", "bytes", "set", "dict", "date",
      "datetime", "time", "timedelta", "decimal", "complex", "ndarray", "dataframe", "series", "repr",
    ]);
  });
});

/** `depth` containers, one in another, built without recursion. */
function nested(depth: number, wrap: string): unknown {
  let value: unknown = 1;
  for (let i = 0; i < depth; i++) {
    if (wrap === "list") value = [value];
    else if (wrap === "object") value = { k: value };
    else if (wrap === "set") value = { $airlock: "set", type: "frozenset", items: [value] };
    else value = { $airlock: "dict", items: [["k", value]] };
  }
  return value;
}

describe("bounds", () => {
  for (const wrap of ["list", "object", "set", "dict"]) {
    test(`depth of ${wrap}s`, () => {
      decode(nested(128, wrap));
      assert.equal(refusal(nested(129, wrap)).reason, "nested more than 128 deep");
      assert.equal(refusal(nested(3, wrap), { maxDepth: 2 }).reason, "nested more than 2 deep");
      assert.equal(decode(1, { maxDepth: 0 }), 1);
      // Ten thousand deep is refused, not a stack overflow.
      const bomb = refusal(nested(10_000, wrap));
      assert.ok(bomb.path.startsWith("$") && bomb.reason === "nested more than 128 deep");
    });
  }

  test("items", () => {
    assert.deepEqual(decode([1, 2], { maxItems: 3 }), [1, 2]);
    assert.equal(refusal([1, 2, 3], { maxItems: 3 }).path, "$[2]");
    assert.equal(refusal({ $airlock: "set", type: "set", items: [1, 2, 3] }, { maxItems: 3 }).path, "$.items[2]");
    assert.equal(refusal({ a: { b: 1 } }, { maxItems: 2 }).path, "$.a.b");
    const bomb = refusal(new Array<number>(1_000_000).fill(0));
    assert.equal(bomb.path, "$[999999]");
    assert.equal(bomb.reason, "more than 1000000 values");
  });
});

describe("parseJson", () => {
  test("keeps integers exact where JSON.parse loses them", () => {
    assert.deepEqual(parseJson("18446744073709551615"), 18446744073709551615n);
    assert.deepEqual(parseJson('{"a": [-9223372036854775808, 12345678901234567890123]}'), {
      a: [-9223372036854775808n, 12345678901234567890123n],
    });
    // Safe integers, floats however long, and digits in strings stay as JSON.parse reads them.
    const text = '[9007199254740991, 1000000000000000, 0.30000000000000004, 12345678901234567.5, 1e300, 1.5e-7,'
      + ' 12345678901234567e2, "12345678901234567", -0, 18446744073709551616]';
    const got = parseJson(text) as unknown[];
    assert.deepEqual(got.slice(0, -1), (JSON.parse(text) as unknown[]).slice(0, -1));
    assert.ok(Object.is(got[8], -0));
    assert.equal(got[9], 18446744073709551616n);
    // But no number is read as an infinity, nor one of thousands of digits.
    for (const huge of ["1e400", "-1e400", "1E+0400", `1${"0".repeat(400)}.5`, `0.${"1".repeat(5000)}`, "9".repeat(5000)]) {
      assert.throws(() => parseJson(`[${huge}]`), SyntaxError, huge.slice(0, 20));
    }
  });

  test("reads what JSON.parse reads, and refuses what it refuses", () => {
    const good = [
      '{"a": "\\u00e9\\ud83d\\ude00\\"\\\\\\/\\b\\f\\n\\r\\t", "b": [true, false, null, {}, [], ""], "é": "😀"}',
      ' \t\n\r[ 1 , { "k" : [ ] } ]\n',
      '"plain"',
      "0",
      '{"a": 1, "a": 2}',
      '{"__proto__": [1]}',
      '"\\ud800"',
    ];
    const bad = ["[1,]", '{"a":1,}', "01", "[1 2]", '"\\x"', '"a\nb"', "", "tru", "{} x", "[", '{"a"}', "{1: 2}", "-", "1.", ".5", "+1", "[1]]", '"abc'];
    // Each text alone (JSON.parse's path) and beside a long integer (the parser's own).
    for (const text of good) {
      const long = parseJson(`[12345678901234567, ${text}]`) as unknown[];
      assert.deepEqual(long[1], JSON.parse(text), text);
      assert.deepEqual(parseJson(text), JSON.parse(text), text);
    }
    const proto = (parseJson('[12345678901234567, {"__proto__": [1]}]') as [bigint, Record<string, unknown>])[1];
    assert.ok(Object.hasOwn(proto, "__proto__") && Object.getPrototypeOf(proto) === Object.prototype);
    for (const text of bad) {
      assert.throws(() => JSON.parse(text), SyntaxError, text);
      assert.throws(() => parseJson(text), SyntaxError, text);
      assert.throws(() => parseJson(`[12345678901234567, ${text}]`), SyntaxError, text);
    }
  });

  test("nesting a hundred thousand deep does not overflow the stack", () => {
    const depth = 100_000;
    const got = parseJson(`${"[".repeat(depth)}12345678901234567${"]".repeat(depth)}`);
    let value = got;
    for (let i = 0; i < depth; i++) {
      assert.ok(Array.isArray(value) && value.length === 1);
      value = value[0];
    }
    assert.equal(value, 12345678901234567n);
  });
});
