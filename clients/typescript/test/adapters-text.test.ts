// The text the adapters give a model, from executions as the server answers them: the rules
// and bounds of the Python client's adapters (clients/python/.../adapters/_text.py), and
// airlock's typed forms shown as Python prints them. Pure functions: the same text from a
// real server's executions is checked in adapters-frameworks.test.ts.

import assert from "node:assert/strict";
import { test } from "node:test";
import type { ExecutionLike } from "../src/adapters/sandbox.js";
import { clip, pickImages, render, show, stripFences } from "../src/adapters/text.js";

function execution(fields: Partial<ExecutionLike>): ExecutionLike {
  return { status: "ok", stdout: "", stderr: "", resultJson: null, ...fields };
}

test("fences are stripped, and only whole fences", () => {
  assert.equal(stripFences("```python\nprint(1)\n```"), "print(1)");
  assert.equal(stripFences("  ```py\nx = 1\ny = 2\n```\n"), "x = 1\ny = 2");
  assert.equal(stripFences("print('```')"), "print('```')");
  assert.equal(stripFences("```\n```"), "");
  assert.equal(stripFences("```python print(1)```"), "```python print(1)```"); // no newline: not a fence
  assert.equal(stripFences("```a b\nx\n```"), "```a b\nx\n```"); // an info string with a space inside
});

test("the parts of an execution, in order", () => {
  const ok = execution({ stdout: "hello\n", stderr: "oops\n", resultJson: 42 });
  assert.equal(render(ok), "stdout:\nhello\nstderr:\noops\nresult: 42");
  assert.equal(render(execution({})), "(the code ran and printed nothing)");
  const exited = execution({ status: "error", stdout: "bye\n", exit_code: 3 });
  assert.equal(render(exited), "status: error: it exited with code 3\nstdout:\nbye");
  const slow = execution({ status: "timeout", limits: { timeout_ms: 500 }, limits_hit: ["wall"] });
  assert.equal(render(slow), "status: timeout (limits hit: wall): it ran longer than its time limit (500 ms) and was killed");
  const failed = execution({
    status: "error",
    error: { type: "ZeroDivisionError", message: "division by zero", traceback: "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero\n" },
  });
  assert.equal(render(failed), "status: error\nTraceback (most recent call last):\n  ...\nZeroDivisionError: division by zero");
  const noted = render(execution({ stdout: "x" }), { note: "a note" });
  assert.equal(noted, "[a note]\nstdout:\nx");
});

test("charts and files are named, never inlined", () => {
  const png = "iVBORw0KGgo".repeat(1000);
  const text = render(
    execution({
      outputs: [{ type: "image/png", data: png } as { type: string }, { type: "text/html" }, { type: "image/png" }],
      files: [{ path: "outputs/report.csv", content: "secret-bytes" } as { path: string }],
      session_ended: true,
    }),
  );
  // Nothing printed: said so, as the notes are no output of the code's.
  assert.equal(
    text,
    "(the code ran and printed nothing)\n" +
      "[3 display output(s) not shown here: image/png, text/html]\n" +
      "[files left in ./outputs: outputs/report.csv]\n" +
      "[the session's interpreter has ended: the next code starts a fresh one, without the earlier variables and files]",
  );
  assert.ok(!text.includes("iVBOR") && !text.includes("secret-bytes"));
});

test("images: PNG outputs within the bounds are picked, the rest named", () => {
  const png = (bytes: number): { type: string; data: string } => ({ type: "image/png", data: btoa("x".repeat(bytes)) });
  const e = execution({ outputs: [png(10), { type: "text/html" }, png(2000), png(20), png(30)] });
  const { images, attached } = pickImages(e, { max: 2, maxBytes: 1000 });
  assert.deepEqual(images.map((i) => i.data), [png(10).data, png(20).data]); // the large one skipped, the last past max
  assert.deepEqual([...attached], [0, 3]);
  assert.equal(
    render(e, { attached }),
    "(the code ran and printed nothing)\n[2 chart(s) attached as image(s)]\n[3 display output(s) not shown here: image/png, text/html]",
  );
  assert.equal(pickImages(e, { maxBytes: 10 }).images.length, 1); // exactly at the bound: kept
});

test("the text is bounded, keeping the beginning and end of each long part", () => {
  const e = execution({
    status: "error",
    stdout: "a".repeat(2_000_000),
    stdout_truncated: true,
    limits_hit: ["output"],
    error: { type: "ValueError", message: "b".repeat(1000), traceback: `Traceback (most recent call last):\nValueError: ${"b".repeat(1000)}` },
  });
  const text = render(e, { maxChars: 3000 });
  assert.ok(text.length <= 3000, `${text.length} characters`);
  assert.ok(text.startsWith("status: error (limits hit: output)\nstdout:\naaa"));
  assert.match(text, /characters cut/);
  assert.match(text, /ValueError: bbb/);
  assert.ok(text.endsWith("[stdout was cut at the sandbox's output limit]"));
  // Whatever the bound, the answer stays within it.
  for (const max of [500, 1000, 20_000]) assert.ok(render(e, { maxChars: max }).length <= max);
});

test("a cut never splits a surrogate pair", () => {
  const text = "😀".repeat(1000);
  for (let limit = 40; limit < 60; limit++) {
    const cut = clip(text, limit);
    assert.ok(cut.length <= limit);
    assert.doesNotThrow(() => encodeURIComponent(cut)); // a lone surrogate would throw
  }
});

test("typed forms read as Python prints them", () => {
  assert.equal(show([{ $airlock: "int", value: "15511210043330985984000000" }, { $airlock: "float", value: "nan" }, { $airlock: "float", value: "-inf" }]),
    "[15511210043330985984000000, nan, -inf]");
  assert.equal(show({ a: [1, 2.5, true, null], "it's": "x" }), `{'a': [1, 2.5, True, None], "it's": 'x'}`);
  assert.equal(show({ $airlock: "bytes", base64: btoa("ab\x00'\xff") }), `b"ab\\x00'\\xff"`);
  assert.equal(show({ $airlock: "set", type: "set", items: [1, 2] }), "{1, 2}");
  assert.equal(show({ $airlock: "set", type: "frozenset", items: [] }), "frozenset()");
  assert.equal(show({ $airlock: "dict", items: [[1, "a"], [[1, 2], "b"]] }), "{1: 'a', [1, 2]: 'b'}");
  assert.equal(show({ $airlock: "decimal", value: "1.10" }), "Decimal('1.10')");
  assert.equal(show({ $airlock: "repr", type: "object", repr: "<object object at 0x7f>", truncated: true }), "<object object at 0x7f> [repr cut]");
  assert.equal(show(1e-7), "1e-07");
  assert.equal(show(1.5e300), "1.5e+300");
  assert.equal(show("line\nnext"), "'line\\nnext'");
  const frame = {
    $airlock: "dataframe",
    columns: ["x"],
    index: Array.from({ length: 25 }, (_, i) => i),
    records: Array.from({ length: 25 }, (_, i) => ({ x: i * i })),
  };
  const shown = show(frame).split("\n");
  assert.equal(shown[0], "DataFrame, columns ['x']");
  assert.equal(shown[1], "0: {'x': 0}");
  assert.equal(shown.length, 22);
  assert.equal(shown[21], "... (25 rows)");
  // A dict the code built with a "$airlock" key comes as a "dict" form, so a plain object
  // here is always the code's own dict.
  assert.equal(show({ repr: "x", truncated: false }), "{'repr': 'x', 'truncated': False}");
});

test("the core import loads no framework: only the adapters' own modules import one", async () => {
  const { readFileSync } = await import("node:fs");
  const { dirname, join } = await import("node:path");
  const { fileURLToPath } = await import("node:url");
  const frameworks = /^(ai|ai\/.*|@langchain\/.*|langchain|@openai\/agents.*|@mastra\/.*|zod.*)$/;
  // Every module the core's entry reaches through its imports, and each bare import among them.
  const seen = new Set<string>();
  const bare: string[] = [];
  const visit = (file: string): void => {
    if (seen.has(file)) return;
    seen.add(file);
    for (const [, spec] of readFileSync(file, "utf8").matchAll(/(?:^|\n)\s*(?:import|export)[^"'\n]*?from\s*["']([^"']+)["']/g)) {
      if (spec === undefined) continue;
      if (spec.startsWith(".")) visit(join(dirname(file), spec));
      else bare.push(spec);
    }
  };
  visit(join(dirname(fileURLToPath(import.meta.url)), "..", "src", "index.js"));
  assert.ok(seen.size > 1);
  assert.deepEqual(bare.filter((s) => frameworks.test(s)), []);
  assert.ok(![...seen].some((f) => f.includes("/src/adapters/")), [...seen].join("\n"));
});
