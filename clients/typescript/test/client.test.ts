import { before, test } from "node:test";
import assert from "node:assert/strict";

import {
  Airlock,
  ExecutionFailedError,
  LimitAboveCeilingError,
  InvalidRequestError,
  NotFoundError,
  ForbiddenError,
  UnauthorizedError,
  PayloadTooLargeError,
  TransportError,
  type StreamEvent,
} from "../src/index.js";
import { EXECUTE_ONLY, KEY, launch, useServer } from "./harness.js";

const server = useServer();
let client: Airlock;

before(async () => {
  client = new Airlock({ baseUrl: (await server.ready()).url, apiKey: KEY });
});

test("run returns every field of the result", async () => {
  const code = 'print("hello")\nimport sys\nprint("warn", file=sys.stderr)\n6 * 7';
  const e = await client.run(code);
  assert.equal(e.status, "ok");
  assert.ok(e.ok);
  assert.equal(e.exit_code, 0);
  assert.equal(e.signal ?? null, null);
  assert.deepEqual([e.stdout, e.stderr], ["hello\n", "warn\n"]);
  assert.equal(e.result, 42);
  assert.equal(e.resultJson, 42);
  assert.equal(e.error ?? null, null);
  assert.deepEqual(e.limits_hit, []);
  assert.match(e.id, /^ex_/);
  assert.match(e.requestId ?? "", /^rq_/);
  assert.ok(e.limits.timeout_ms > 0);
  assert.equal(e.isolation.network, "none");
  const record = await client.execution(e.id);
  assert.deepEqual([record.id, record.status, record.key], [e.id, "ok", "client"]);
  assert.equal(record.code_bytes, code.length);
});

test("run with files, stdin, env and limits", async () => {
  const code =
    "import os, sys\n" +
    "data = open('data/in.bin', 'rb').read()\n" +
    "os.makedirs('outputs', exist_ok=True)\n" +
    "open('outputs/out.txt', 'w').write(open('notes.txt').read().upper())\n" +
    "[len(data), data[:2].hex(), sys.stdin.read(), os.environ['GREETING']]";
  const bytes = new Uint8Array(20).map((_, i) => (i % 2 === 0 ? 0x00 : 0xff));
  const e = await client.run(code, {
    files: { "data/in.bin": bytes, "notes.txt": "héllo" },
    stdin: "from stdin",
    env: { GREETING: "hi" },
    limits: { timeout_ms: 20_000, memory_mb: 256 },
  });
  assert.ok(e.ok, JSON.stringify(e.error));
  assert.deepEqual(e.result, [20, "00ff", "from stdin", "hi"]);
  assert.equal(e.limits.timeout_ms, 20_000);
  assert.equal(e.limits.memory_mb, 256);
  assert.equal(e.files.length, 1);
  assert.equal(e.files[0]?.path, "out.txt");
  assert.equal(atob(e.files[0]?.base64 ?? ""), new TextEncoder().encode("HÉLLO").reduce((s, b) => s + String.fromCharCode(b), ""));
});

test("statuses are results, not errors", async () => {
  const e = await client.run("import time\ntime.sleep(5)", { limits: { timeout_ms: 500 } });
  assert.equal(e.status, "timeout");
  assert.ok(!e.ok);
  assert.deepEqual(e.limits_hit, ["wall_time"]);
});

test("call returns the value and throws on failure", async () => {
  const code = "def add(a, b):\n    return a + b\ndef boom():\n    raise ValueError('no')\n";
  assert.equal(await client.call(code, "add", { a: 40, b: 2 }), 42);
  await assert.rejects(client.call(code, "boom"), (e: unknown) => {
    assert.ok(e instanceof ExecutionFailedError);
    assert.match(e.message, /ValueError: no/);
    return true;
  });
});

test("eval evaluates literals natively", async () => {
  const v = await client.eval("[1, 2] * 2 + [{'a': (3,)}]");
  assert.ok(v.ok);
  assert.deepEqual(v.value, [1, 2, 1, 2, { a: [3] }]);
  assert.equal(v.type, "list");
  assert.equal(v.repr, "[1, 2, 1, 2, {'a': (3,)}]");
  const bad = await client.eval("1 / 0");
  assert.ok(!bad.ok);
  assert.equal(bad.error?.type, "ZeroDivisionError");
  assert.equal(bad.value, undefined);
});

test("stream yields output as it is written, then display outputs and the result", async () => {
  const code =
    "import sys, time\nfor i in range(3):\n    print(i)\n    time.sleep(0.2)\n" +
    "print('e', file=sys.stderr)\ndisplay('<b>x</b>', mime='text/html')\n'done'";
  const seen: StreamEvent[] = [];
  for await (const event of client.stream(code)) seen.push(event);
  const stdout = seen.flatMap((e) => (e.type === "stdout" ? [e.text] : []));
  assert.equal(stdout.join(""), "0\n1\n2\n");
  assert.ok(stdout.length >= 2, "output arrived in pieces as it was written");
  const last = seen.at(-1);
  assert.equal(last?.type, "result");
  if (last?.type !== "result") return;
  assert.equal(last.execution.result, "done");
  assert.equal(last.execution.output_streamed, true);
  assert.equal(last.execution.stdout, "0\n1\n2\n");
  assert.equal(last.execution.stderr, "e\n");
  const displays = seen.flatMap((e) => (e.type === "display" ? [e.output] : []));
  assert.deepEqual(displays, [{ type: "text/html", data: "<b>x</b>" }]);
  assert.deepEqual(last.execution.outputs, displays);
});

test("outputs carry charts and JSON", async () => {
  const e = await client.run(
    "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n" +
      "display({'k': [1]})\ndisplay('<b>x</b>', mime='text/html')",
  );
  assert.ok(e.ok, JSON.stringify(e.error));
  assert.deepEqual(e.outputs.map((o) => o.type), ["image/png", "application/json", "text/html"]);
  assert.ok(atob(String(e.outputs[0]?.data)).startsWith("\x89PNG\r\n\x1a\n"));
  assert.deepEqual(e.outputs[1]?.data, { k: [1] });
});

test("errors carry their code, status, request id and field", async () => {
  const stranger = new Airlock({ baseUrl: server().url, apiKey: "wrong-key" });
  await assert.rejects(stranger.run("1"), (e: unknown) => {
    assert.ok(e instanceof UnauthorizedError);
    assert.equal(e.status, 401);
    assert.equal(e.code, "unauthorized");
    assert.ok(e.invalidToken);
    assert.match(e.requestId ?? "", /^rq_/);
    return true;
  });
  const e = await client.run("1");
  const limited = new Airlock({ baseUrl: server().url, apiKey: EXECUTE_ONLY });
  await assert.rejects(limited.execution(e.id), ForbiddenError);
  await assert.rejects(client.execution("ex_does_not_exist"), NotFoundError);
  await assert.rejects(client.run("1", { limits: { timeout_ms: 1e9 } }), (err: unknown) => {
    assert.ok(err instanceof LimitAboveCeilingError);
    assert.equal(err.field, "limits.timeout_ms");
    return true;
  });
  await assert.rejects(client.run("1", { environment: "no-such-environment" }), (err: unknown) => {
    assert.ok(err instanceof InvalidRequestError);
    assert.equal(err.field, "environment");
    return true;
  });
});

test("a body over the server's limit is a PayloadTooLargeError", async () => {
  // A server that takes 64 KiB: the 100 KB sent fit in the connection's buffers, so the
  // client has written them all when the server answers 413 and closes (a body of
  // megabytes would still be being written then, and the write would fail first).
  const small = await launch({ extra: "[http]\nmax_body_bytes = 65536\n" });
  try {
    const client = new Airlock({ baseUrl: small.url, apiKey: KEY });
    await assert.rejects(client.run("x = 1\n".repeat(100_000 / 6)), (err: unknown) => {
      assert.ok(err instanceof PayloadTooLargeError, String(err));
      assert.equal(err.status, 413);
      return true;
    });
  } finally {
    await small.stop();
  }
});

test("a server that is gone is a transport error", async () => {
  const gone = new Airlock({ baseUrl: "http://127.0.0.1:9", apiKey: KEY });
  await assert.rejects(gone.run("1"), TransportError);
});
