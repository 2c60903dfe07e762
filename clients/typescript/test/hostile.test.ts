// The client against a hostile server (a small HTTP server on loopback in this process, as
// clients/python/tests/test_hostile.py has): deep nesting, huge and compressed answers,
// unknown forms, a pickle, wrong content types, broken event streams, redirects, odd ids,
// proxies from the environment. Each is refused with a ProtocolError (or the typed error it
// stands for), within the client's bounds, and nothing in it is used.

import { after, afterEach, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";

import {
  Airlock,
  AirlockError,
  ClientTimeoutError,
  DecodeError,
  ProtocolError,
  RateLimitedError,
  ServiceUnavailableError,
  SessionEndedError,
  TransportError,
  UnavailableError,
  InvalidRequestError,
  type AirlockOptions,
} from "../src/index.js";

const RESULT: Record<string, unknown> = {
  id: "ex_1",
  status: "ok",
  exit_code: 0,
  signal: null,
  stdout: "",
  stderr: "",
  stdout_truncated: false,
  stderr_truncated: false,
  result: 1,
  error: null,
  outputs: [],
  files: [],
  usage: { wall_ms: 1, cpu_ms: 1, memory_peak_bytes: 1, tool_calls: 0 },
  limits: { timeout_ms: 1, memory_mb: 1, cpu_ms: 1, pids: 1, disk_mb: 1, output_bytes: 1 },
  limits_hit: [],
  isolation: {
    namespaces: ["user"],
    uid: 1,
    network: "none",
    filesystem: "x",
    seccomp: "x",
    landlock: "x",
    landlock_abi: null,
    cgroup: "v1",
    no_new_privs: true,
    capabilities: [],
    downgraded: [],
  },
};

const SESSION = {
  id: "s1",
  created_at: "t",
  expires_at: "t",
  idle_timeout_ms: 1,
  max_lifetime_ms: 1,
  cells: 0,
  ended: null,
  limits: RESULT["limits"],
};

/** A body made as it is sent: writes until it returns or the client hangs up. */
type Producer = (write: (chunk: string | Uint8Array) => Promise<boolean>) => Promise<void>;
type Body = string | Uint8Array | Producer;

interface Canned {
  status: number;
  headers: Record<string, string>;
  body: Body;
}

/** The hostile server: answers each request with the next canned answer, and records what it
 * was asked. */
class Hostile {
  url = "";
  answers: Canned[] = [];
  seen: string[] = [];
  headers: IncomingHttpHeaders[] = [];
  times: number[] = [];
  readonly #server: Server;

  constructor() {
    this.#server = createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        this.seen.push(`${req.method} ${req.url}`);
        this.headers.push(req.headers);
        this.times.push(Date.now());
        void this.#answer(res);
      });
    });
  }

  async listen(): Promise<void> {
    await new Promise<void>((resolve) => this.#server.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${port(this.#server)}`;
  }

  async close(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise((resolve) => this.#server.close(resolve));
  }

  reset(): void {
    this.answers = [];
    this.seen = [];
    this.headers = [];
    this.times = [];
  }

  answer(status: number, body: Body, contentType = "application/json", headers: Record<string, string> = {}): void {
    const all: Record<string, string> = { ...headers };
    if (contentType !== "") all["Content-Type"] = contentType;
    this.answers.push({ status, headers: all, body });
  }

  json(value: unknown, status = 200, headers: Record<string, string> = {}): void {
    this.answer(status, JSON.stringify(value), "application/json", headers);
  }

  result(changes: Record<string, unknown> = {}): void {
    this.json({ ...RESULT, ...changes });
  }

  client(options: Omit<AirlockOptions, "baseUrl" | "apiKey"> = {}): Airlock {
    // A timeout on every call: a client that read on where it should have refused fails the
    // test with a ClientTimeoutError instead of hanging it.
    return new Airlock({ baseUrl: this.url, apiKey: "k", maxRetries: 0, timeoutMs: 30_000, ...options });
  }

  async #answer(res: ServerResponse): Promise<void> {
    const next = this.answers.shift();
    if (next === undefined) {
      res.writeHead(500, { "Content-Length": "0" }).end();
      return;
    }
    const { status, headers, body } = next;
    if (status === 0) {
      // A connection cut before any answer.
      res.socket?.destroy();
      return;
    }
    if (typeof body !== "function") {
      const bytes = typeof body === "string" ? Buffer.from(body) : body;
      res.writeHead(status, { "Content-Length": String(bytes.byteLength), ...headers }).end(bytes);
      return;
    }
    res.writeHead(status, { Connection: "close", ...headers });
    res.flushHeaders();
    const write = (chunk: string | Uint8Array): Promise<boolean> =>
      new Promise((resolve) => {
        if (res.destroyed || res.writableEnded) return resolve(false);
        if (res.write(chunk)) return resolve(!res.destroyed);
        const done = (): void => {
          res.off("drain", done).off("close", done);
          resolve(!res.destroyed);
        };
        res.on("drain", done).on("close", done);
      });
    try {
      await body(write);
    } finally {
      if (!res.destroyed) res.end();
    }
  }
}

function port(server: Server): number {
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no address");
  return address.port;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function sse(...events: [string, unknown][]): string {
  return events.map(([name, data]) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`).join("");
}

/** Drains a stream of the client, giving what it threw (or failing when it threw nothing). */
async function drained(stream: AsyncIterable<unknown>): Promise<unknown> {
  try {
    for await (const _ of stream) {
      // Only the end matters.
    }
  } catch (e) {
    return e;
  }
  return assert.fail("the stream ended without an error");
}

/** What `promise` rejected with (failing when it resolved). */
async function thrown(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  return assert.fail("the call did not throw");
}

function isProtocol(error: unknown, match: RegExp): void {
  assert.ok(error instanceof ProtocolError, `expected a ProtocolError, got ${String(error)}`);
  assert.match(error.message, match);
}

const hostile = new Hostile();
before(() => hostile.listen());
after(() => hostile.close());
afterEach(() => hostile.reset());

test("a well-formed answer is read", async () => {
  hostile.result({ result: { $airlock: "bytes", base64: "aGk=" } });
  const execution = await hostile.client().run("x");
  assert.deepEqual(execution.result, new TextEncoder().encode("hi"));
  assert.deepEqual(hostile.seen, ["POST /v1/execute"]);
});

test("deep nesting is refused", async () => {
  hostile.answer(200, "[".repeat(200_000) + "]".repeat(200_000));
  isProtocol(await thrown(hostile.client().run("x")), /expected an object/);
  // Deep in a result: the decoder's bound, naming where.
  hostile.answer(200, JSON.stringify({ ...RESULT, result: null }).replace('"result":null', `"result":${"[".repeat(200_000)}${"]".repeat(200_000)}`));
  const deep = await thrown(hostile.client().run("x"));
  assert.ok(deep instanceof DecodeError, String(deep));
  assert.match(deep.message, /^\$\.result(\[0\])+: nested more than/);
  // In a stream's event too.
  hostile.answer(200, `event: stdout\ndata: ${"[".repeat(100_000)}${"]".repeat(100_000)}\n\n`, "text/event-stream");
  isProtocol(await drained(hostile.client().stream("x")), /stdout event/);
});

test("a huge answer is refused by its length before it is read", async () => {
  // Its length says 10 GiB and no byte of it ever comes: only the length can refuse it (a
  // client that read it would wait for its timeout).
  hostile.answer(200, () => new Promise(() => undefined), "application/json", { "Content-Length": String(10 * 2 ** 30) });
  isProtocol(await thrown(hostile.client({ maxResponseBytes: 1 << 20 }).run("x")), /over the client's limit/);
});

test("a huge answer without a length stops at the limit", async () => {
  let sent = 0;
  hostile.answer(200, async (write) => {
    const chunk = "[" + " ".repeat(65535);
    while (await write(chunk)) sent += chunk.length;
  });
  isProtocol(await thrown(hostile.client({ maxResponseBytes: 1 << 20 }).run("x")), /over the client's limit/);
  assert.ok(sent < 64 << 20, `the server sent ${sent} bytes`);
});

for (const encoding of ["gzip", "gzip, gzip", "br", "deflate", "x-unknown"]) {
  test(`a compressed answer is refused before it is inflated (${encoding})`, async () => {
    // 64 KiB of gzip that would be 64 MiB of spaces; with two layers far more. A client that
    // inflated it would meet its size limit, not this refusal.
    const bomb = gzipSync(Buffer.alloc(64 << 20, " "), { level: 9 });
    hostile.answer(200, bomb, "application/json", { "Content-Encoding": encoding });
    isProtocol(await thrown(hostile.client().run("x")), /compressed/);
    assert.equal(hostile.headers[0]?.["accept-encoding"], "identity");
    hostile.answer(200, bomb, "text/event-stream", { "Content-Encoding": encoding });
    isProtocol(await drained(hostile.client().stream("x")), /compressed/);
    hostile.answer(200, SESSION_BODY, "application/json", {});
    hostile.answer(200, bomb, "application/octet-stream", { "Content-Encoding": encoding });
    hostile.answer(200, bomb, "application/octet-stream", { "Content-Encoding": encoding });
    const session = await hostile.client().sessionById("s1");
    isProtocol(await thrown(session.download("a.txt")), /compressed/);
    isProtocol(await thrown(session.downloadStream("a.txt")), /compressed/);
    for (const headers of hostile.headers) assert.equal(headers["accept-encoding"], "identity");
  });
}

const SESSION_BODY = JSON.stringify(SESSION);

for (const form of [
  { $airlock: "pickle", data: "gASVBQAAAAAAAACMAm9zlC4=" },
  { $airlock: "eval", code: "__import__('os').system('id')" },
  { $airlock: "bytes", base64: "not base64!" },
  { $airlock: "bytes" },
  { $airlock: "ndarray", dtype: "object", shape: [1], data: [{ $airlock: "nope" }] },
]) {
  test(`unknown or broken forms are refused (${JSON.stringify(form).slice(0, 40)})`, async () => {
    hostile.result({ result: { ok: [form] } });
    const error = await thrown(hostile.client().run("x"));
    assert.ok(error instanceof DecodeError, String(error));
    assert.match(error.message, /^\$\.result\.ok\[0\]/);
  });
}

test("a pickle is never loaded", async () => {
  const dir = mkdtempSync(join(tmpdir(), "airlock-hostile-"));
  try {
    const canary = join(dir, "canary");
    // A protocol-0 pickle that runs `touch canary` when it is loaded.
    const payload = new TextEncoder().encode(`cposix\nsystem\n(S'touch ${canary}'\ntR.`);
    for (const contentType of ["application/python-pickle", "application/octet-stream", "application/json"]) {
      hostile.answer(200, payload, contentType);
      isProtocol(await thrown(hostile.client().run("x")), /./);
    }
    hostile.result({ result: { $airlock: "bytes", base64: Buffer.from(payload).toString("base64") } });
    assert.deepEqual((await hostile.client().run("x")).result, payload);
    assert.equal(existsSync(canary), false);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

const { usage: _, ...withoutUsage } = RESULT;
for (const [name, body, contentType, match] of [
  ["html", "<html>hi</html>", "text/html", /expected application\/json/],
  ["no content type", JSON.stringify(RESULT), "", /expected application\/json/],
  ["cut JSON", '{"status": "ok",', "application/json", /not valid JSON/],
  ["NaN", '{"a": NaN}', "application/json", /not valid JSON/],
  ["Infinity", '{"a": Infinity}', "application/json", /not valid JSON/],
  ["5000 digits", `{"a": ${"9".repeat(5000)}}`, "application/json", /not valid JSON/],
  ["5000 digits in a fraction", `{"a": 0.${"9".repeat(5000)}}`, "application/json", /not valid JSON/],
  ["1e999", JSON.stringify(RESULT).replace('"wall_ms":1', '"wall_ms":1e999'), "application/json", /too large/],
  ["bad UTF-8", new Uint8Array([0xff, 0xfe]), "application/json", /not UTF-8/],
  ["an array", "[1]", "application/json", /expected an object/],
  ["an unknown status", JSON.stringify({ ...RESULT, status: "fine" }), "application/json", /\$\.status: unknown status "fine"/],
  ["a string exit code", JSON.stringify({ ...RESULT, exit_code: "0" }), "application/json", /\$\.exit_code: expected an integer/],
  ["a number for a flag", JSON.stringify({ ...RESULT, stdout_truncated: 0 }), "application/json", /\$\.stdout_truncated: expected a boolean/],
  ["no usage", JSON.stringify(withoutUsage), "application/json", /\$\.usage: missing/],
  ["a number for stdout", JSON.stringify({ ...RESULT, stdout: 1 }), "application/json", /\$\.stdout: expected a string/],
  [
    "a file that is not base64",
    JSON.stringify({ ...RESULT, files: [{ path: "a", size: 1, base64: "*" }] }),
    "application/json",
    /\$\.files\[0\]\.base64: not base64/,
  ],
] as const) {
  test(`malformed answers are refused (${name})`, async () => {
    hostile.answer(200, body, contentType);
    isProtocol(await thrown(hostile.client().run("x")), match);
  });
}

test("redirects are not followed: the key never goes to another origin", async () => {
  const elsewhere = new Hostile();
  await elsewhere.listen();
  try {
    for (const status of [301, 302, 303, 307, 308]) {
      hostile.answer(status, "", "", { Location: `${elsewhere.url}/v1/execute` });
      isProtocol(await thrown(hostile.client().run("x")), new RegExp(`unexpected HTTP ${status}`));
    }
    assert.equal(hostile.seen.length, 5);
    assert.deepEqual(elsewhere.seen, []);
  } finally {
    await elsewhere.close();
  }
});

test("a proxy's error page keeps its status", async () => {
  hostile.answer(502, "<html>" + "bad gateway ".repeat(100) + "</html>", "text/html");
  const error = await thrown(hostile.client().run("x"));
  assert.ok(error instanceof ProtocolError);
  assert.equal(error.status, 502);
  assert.match(error.message, /bad gateway/);
  assert.ok(error.message.length < 300, error.message);
});

const REFUSAL = JSON.stringify({ error: { code: "rate_limited", message: "slow down" } });
const OVERLOADED = JSON.stringify({ error: { code: "overloaded", message: "full" } });

test("Retry-After is honoured within the bound", async () => {
  hostile.answer(429, REFUSAL, "application/json", { "Retry-After": "1" });
  hostile.answer(503, OVERLOADED, "application/json", { "Retry-After": "1" });
  hostile.result();
  assert.ok((await hostile.client({ maxRetries: 2 }).run("x")).ok);
  assert.equal(hostile.seen.length, 3);
  const [a, b, c] = hostile.times as [number, number, number];
  assert.ok(b - a >= 990 && c - b >= 990, `sent again after ${b - a} and ${c - b} ms`);
  // None past the bound.
  hostile.reset();
  hostile.answer(429, REFUSAL, "application/json", { "Retry-After": "1" });
  const limited = await thrown(hostile.client({ maxRetries: 0 }).run("x"));
  assert.ok(limited instanceof RateLimitedError);
  assert.equal(limited.retryAfterMs, 1000);
  assert.match(limited.message, /slow down/);
  hostile.answer(429, REFUSAL, "application/json", { "Retry-After": "120" });
  assert.ok((await thrown(hostile.client({ maxRetries: 5, maxRetryWaitMs: 10_000 }).run("x"))) instanceof RateLimitedError);
  assert.equal(hostile.seen.length, 2);
});

test("nothing else is retried, by default or not", async () => {
  const client = new Airlock({ baseUrl: hostile.url, apiKey: "k", timeoutMs: 30_000 });
  hostile.answer(503, OVERLOADED);
  assert.ok((await thrown(client.run("x"))) instanceof ServiceUnavailableError);
  hostile.json({ error: { code: "internal", message: "m" } }, 500, { "Retry-After": "1" });
  assert.ok((await thrown(client.run("x"))) instanceof AirlockError);
  hostile.answer(502, "<html>bad gateway</html>", "text/html", { "Retry-After": "1" });
  assert.ok((await thrown(client.run("x"))) instanceof ProtocolError);
  // A proxy's 503 page to a POST: not airlock's refusal, so the request may have run.
  hostile.answer(503, "<html>busy</html>", "text/html", { "Retry-After": "1" });
  assert.ok((await thrown(client.run("x"))) instanceof ProtocolError);
  assert.equal(hostile.seen.length, 4);
  // A connection cut before its answer.
  hostile.answer(0, "");
  hostile.result();
  assert.ok((await thrown(client.run("x"))) instanceof TransportError);
  assert.equal(hostile.seen.length, 5);
});

for (const [value, expected] of [
  ["\u00b2", undefined],
  ["9".repeat(5000), undefined],
  ["-1", undefined],
  ["1.5", undefined],
  [" 2 ", 2000],
  ["Wed, 21 Oct 2015 07:28:00 GMT", 0],
] as const) {
  test(`odd Retry-After values are no crash (${value.slice(0, 20)})`, async () => {
    hostile.answer(429, REFUSAL, "application/json", { "Retry-After": value });
    const limited = await thrown(hostile.client().run("x"));
    assert.ok(limited instanceof RateLimitedError);
    assert.equal(limited.retryAfterMs, expected);
  });
}

test("one call has a deadline however slowly its answer trickles", async () => {
  const body = JSON.stringify(RESULT);
  hostile.answer(200, async (write) => {
    for (const c of body) {
      await sleep(200);
      if (!(await write(c))) return;
    }
  });
  const error = await thrown(hostile.client({ timeoutMs: 1000 }).run("x"));
  assert.ok(error instanceof ClientTimeoutError, String(error));
  hostile.answer(
    200,
    async (write) => {
      do await sleep(200);
      while (await write(": keep-alive\n\n"));
    },
    "text/event-stream",
  );
  const streamed = await drained(hostile.client({ timeoutMs: 1000 }).stream("x"));
  assert.ok(streamed instanceof ClientTimeoutError, String(streamed));
  // A server that says nothing at all.
  hostile.answer(200, () => new Promise(() => undefined));
  assert.ok((await thrown(hostile.client({ timeoutMs: 500 }).run("x"))) instanceof ClientTimeoutError);
});

test("hostile ids cannot reach other routes", async () => {
  hostile.json({ ...SESSION, id: "../../execute?x=" }, 201);
  hostile.result();
  hostile.answer(200, "file", "application/octet-stream");
  const session = await hostile.client().session();
  await session.run("x");
  assert.deepEqual(await session.download("a b/c.txt"), new TextEncoder().encode("file"));
  assert.deepEqual(hostile.seen.slice(1), [
    "POST /v1/sessions/..%2F..%2Fexecute%3Fx%3D/execute",
    "GET /v1/sessions/..%2F..%2Fexecute%3Fx%3D/files/a%20b/c.txt",
  ]);
});

test("ids that are dots are refused", async () => {
  const client = hostile.client();
  for (const bad of [".", ".."]) {
    // Thrown at once or as the promise's rejection: either way before anything is sent.
    await assert.rejects(async () => client.execution(bad), TypeError);
    await assert.rejects(async () => client.environments.show(bad), TypeError);
    await assert.rejects(async () => client.approval(bad), TypeError);
    await assert.rejects(async () => client.sessionById(bad), TypeError);
    await assert.rejects(async () => client.background(bad).refresh(), TypeError);
    await assert.rejects(async () => client.volumes.show(bad), TypeError);
  }
  // A session the server names "..": no handle on it is made, so no request can follow.
  hostile.json({ ...SESSION, id: ".." }, 201);
  await assert.rejects(client.session(), TypeError);
  assert.deepEqual(hostile.seen, ["POST /v1/sessions"]);
});

test("only the call's own status answers it", async () => {
  const client = hostile.client();
  hostile.answer(302, JSON.stringify(RESULT), "application/json", { Location: "/login" });
  isProtocol(await thrown(client.run("x")), /unexpected HTTP 302/);
  hostile.json(SESSION, 200); // a create answers 201
  isProtocol(await thrown(client.session()), /unexpected HTTP 200/);
  hostile.json(SESSION, 201);
  const session = await client.session();
  hostile.answer(302, "<html>login</html>", "text/html", { Location: "/login" });
  isProtocol(await thrown(session.download("a.txt")), /unexpected HTTP 302/);
  hostile.answer(200, ""); // a close answers 204
  isProtocol(await thrown(session.close()), /unexpected HTTP 200/);
  assert.equal(session.closed, false);
  hostile.answer(204, "", "");
  await session.close();
  assert.equal(session.closed, true);
});

test("a well-formed stream is read", async () => {
  const result = JSON.stringify({ ...RESULT, result: 0, output_streamed: true }).replace('"result":0', '"result":18446744073709551615');
  const body = ": a comment\n\n" + sse(["stdout", { text: "a" }], ["stderr", { text: "b" }]) + `event: result\ndata: ${result}\n\n`;
  hostile.answer(200, body.replaceAll("\n", "\r\n"), "text/event-stream");
  const execution = await hostile.client().stream("x").result();
  assert.deepEqual([execution.stdout, execution.stderr], ["a", "b"]);
  // Read exactly, as an answer is.
  assert.equal(execution.result, 18446744073709551615n);
});

for (const [name, body, match] of [
  ["no result", sse(["stdout", { text: "a" }]), /ended before its result/],
  ["an unknown event", sse(["exploit", { text: "a" }]), /unknown event "exploit"/],
  ["a number for text", sse(["stdout", { text: 1 }]), /stdout event/],
  ["a field too many", sse(["stdout", { text: "a", more: 1 }]), /stdout event/],
  ["truncated stdin", sse(["truncated", { stream: "stdin", limit: 1 }]), /truncated event/],
  ["not JSON", "event: stdout\ndata: {not json\n\n", /not JSON/],
  ["an unknown field", "evil: 1\n\n", /unknown event field "evil"/],
  ["bad UTF-8", new Uint8Array([...new TextEncoder().encode("event: stdout\ndata: "), 0xff, 10, 10]), /not UTF-8/],
  ["an event after the result", sse(["result", RESULT], ["stdout", { text: "late" }]), /after the stream's result/],
  ["an unknown status", sse(["result", { ...RESULT, status: "great" }]), /unknown status "great"/],
] as const) {
  test(`broken streams are refused (${name})`, async () => {
    hostile.answer(200, body, "text/event-stream");
    isProtocol(await drained(hostile.client().stream("x")), match);
  });
}

test("an endless stream stops at the limit", async () => {
  hostile.answer(
    200,
    async (write) => {
      while (await write(sse(["stdout", { text: "x".repeat(60_000) }])));
    },
    "text/event-stream",
  );
  isProtocol(await drained(hostile.client({ maxResponseBytes: 1 << 20 }).stream("x")), /over the client's limit/);
  // One line that never ends is bounded the same way.
  hostile.answer(
    200,
    async (write) => {
      await write("data: ");
      while (await write("x".repeat(65536)));
    },
    "text/event-stream",
  );
  isProtocol(await drained(hostile.client({ maxResponseBytes: 1 << 20 }).stream("x")), /over the client's limit/);
});

test("a stream's error event is the typed error; a JSON answer is no stream", async () => {
  hostile.answer(200, sse(["error", { error: { code: "unavailable", message: "no sandbox" } }]), "text/event-stream");
  const error = await drained(hostile.client().stream("x"));
  assert.ok(error instanceof UnavailableError);
  assert.match(error.message, /no sandbox/);
  hostile.json(RESULT);
  isProtocol(await drained(hostile.client().stream("x")), /expected text\/event-stream/);
});

test("a stream refused with Retry-After is opened again", async () => {
  hostile.answer(503, OVERLOADED, "application/json", { "Retry-After": "1" });
  hostile.answer(200, sse(["result", { ...RESULT, output_streamed: true }]), "text/event-stream");
  assert.ok((await hostile.client({ maxRetries: 1 }).stream("x").result()).ok);
  assert.equal(hostile.seen.length, 2);
  hostile.answer(503, OVERLOADED, "application/json", { "Retry-After": "1" });
  assert.ok((await drained(hostile.client().stream("x"))) instanceof ServiceUnavailableError);
});

test("a stream that failed or was closed throws airlock's errors", async () => {
  hostile.answer(200, sse(["error", { error: { code: "session_ended", message: "gone" } }]), "text/event-stream");
  const stream = hostile.client().stream("x");
  const ended = await drained(stream);
  assert.ok(ended instanceof SessionEndedError);
  assert.equal(ended.status, 409);
  isProtocol(await thrown(stream.result()), /ended before its result/);
  hostile.answer(200, sse(["stdout", { text: "a" }]) + "event: stdout\n", "text/event-stream");
  const open = hostile.client().stream("x");
  const iterator = open[Symbol.asyncIterator]();
  assert.deepEqual((await iterator.next()).value, { type: "stdout", text: "a" });
  open.close();
  const closed = await thrown(iterator.next());
  assert.ok(closed instanceof TransportError, String(closed));
  hostile.answer(200, sse(["error", { error: { code: "invalid_request", message: "m", field: "code" } }]), "text/event-stream");
  const bad = await thrown(hostile.client().stream("x").result());
  assert.ok(bad instanceof InvalidRequestError);
  assert.deepEqual([bad.status, bad.field], [400, "code"]);
});

test("eval values are decoded strictly", async () => {
  const evaluation = (value: unknown): Record<string, unknown> => ({ ok: true, type: "list", repr: "...", str: "...", value });
  hostile.json(evaluation([{ $airlock: "int", value: "18446744073709551616" }, { $airlock: "float", value: "-inf" }]));
  assert.deepEqual((await hostile.client().eval("x")).value, [2n ** 64n, -Infinity]);
  for (const bad of [{ $airlock: "int", value: "1e30" }, { $airlock: "float", value: "NaN" }, { $airlock: "pickle" }]) {
    hostile.json(evaluation([bad]));
    const error = await thrown(hostile.client().eval("x"));
    assert.ok(error instanceof DecodeError, String(error));
    assert.match(error.message, /^\$\.value\[0\]/);
  }
});

test("an error's text is cleaned of control characters", async () => {
  hostile.json({ error: { code: "invalid_request", message: "bad\u001b[2J\u0007", field: "a\nb" } }, 400);
  const bad = await thrown(hostile.client().run("x"));
  assert.ok(bad instanceof InvalidRequestError);
  assert.ok(!/[\u0000-\u001f]/.test(bad.message), JSON.stringify(bad.message));
  assert.match(bad.message, /bad \[2J /);
  assert.equal(bad.field, "a b");
});

test("a key that is not a header value is refused without quoting it", async () => {
  for (const apiKey of ["sk-SECRET\n", "sk-SECRET key", "sk-SECRÉT", "sk-SECRET\u0000"]) {
    assert.throws(
      () => new Airlock({ baseUrl: hostile.url, apiKey }),
      (e: unknown) => e instanceof TypeError && !e.message.includes("SECR"),
    );
  }
  assert.deepEqual(hostile.seen, []);
  // A failed request's message never holds the key, nor does the client's inspection.
  const closed = new Hostile();
  await closed.listen();
  await closed.close();
  const client = new Airlock({ baseUrl: closed.url, apiKey: "sk-SECRET", timeoutMs: 30_000 });
  const failed = await thrown(client.run("x"));
  assert.ok(failed instanceof TransportError, String(failed));
  const { inspect } = await import("node:util");
  for (const text of [String(failed), inspect(failed, { depth: 10 }), inspect(client, { depth: 10 }), JSON.stringify(client)]) {
    assert.ok(!text.includes("SECRET"), text);
  }
});

test("proxies from the environment are not used", async () => {
  // Node's fetch ignores HTTP(S)_PROXY unless told otherwise (NODE_USE_ENV_PROXY on Node 24,
  // a dispatcher of undici's); the client reads none. A child process started with them all
  // pointing at a listening decoy runs a call: the decoy sees nothing.
  const decoy = new Hostile();
  await decoy.listen();
  try {
    hostile.result();
    const index = fileURLToPath(new URL("../src/index.js", import.meta.url));
    const script = `import { Airlock } from ${JSON.stringify(index)};
const execution = await new Airlock({ baseUrl: ${JSON.stringify(hostile.url)}, apiKey: "k" }).run("x");
process.stdout.write(execution.status);`;
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !/^no_proxy$/i.test(k)) env[k] = v;
    for (const name of ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]) env[name] = decoy.url;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { env, stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    const code = await new Promise((resolve) => child.on("close", resolve));
    assert.deepEqual([code, out], [0, "ok"]);
    assert.deepEqual(hostile.seen, ["POST /v1/execute"]);
    assert.deepEqual(decoy.seen, []);
  } finally {
    await decoy.close();
  }
});
