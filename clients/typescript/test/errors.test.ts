import { before, test } from "node:test";
import assert from "node:assert/strict";

import {
  AirlockError,
  Airlock,
  ConflictError,
  ERROR_CODES,
  InvalidJsonError,
  MethodNotAllowedError,
  NotFoundError,
  ProtocolError,
  RateLimitedError,
  SessionBusyError,
  SessionEndedError,
  UnsupportedMediaTypeError,
  errorFromAnswer,
  retryAfterMs,
  type Fetch,
} from "../src/index.js";
import { BURST, BURST_PER_MINUTE, KEY, SLOW, useServer } from "./harness.js";
import { htmlErrorPage } from "./proxy.js";

const server = useServer();
let client: Airlock;

before(async () => {
  client = new Airlock({ baseUrl: (await server.ready()).url, apiKey: KEY });
});

/** A `fetch` that counts the requests it passes on to the real one. */
function counting(): { fetch: Fetch; count: () => number } {
  let n = 0;
  return {
    fetch: (input, init) => {
      n++;
      return fetch(input, init);
    },
    count: () => n,
  };
}

test("a rate limit is a RateLimitedError with Retry-After, not retried past the bound", async () => {
  const counter = counting();
  const slow = new Airlock({ baseUrl: server().url, apiKey: SLOW, maxRetries: 3, maxRetryWaitMs: 2000, fetch: counter.fetch });
  assert.ok((await slow.run("1")).ok);
  await assert.rejects(slow.run("1"), (e: unknown) => {
    assert.ok(e instanceof RateLimitedError);
    assert.equal(e.status, 429);
    assert.equal(e.code, "rate_limited");
    // The server asks for most of a minute; the client does not wait that long, it throws.
    assert.ok(e.retryAfterMs !== undefined && e.retryAfterMs > 2000, String(e.retryAfterMs));
    return true;
  });
  assert.equal(counter.count(), 2, "the refusal was not sent again");
});

/** Spends `BURST`'s tokens until a request is refused; returns that refusal. A request with
 * a malformed body is the cheapest: admitted (a token taken), then refused. */
async function exhaust(): Promise<RateLimitedError> {
  const once = new Airlock({ baseUrl: server().url, apiKey: BURST, maxRetries: 0 });
  const malformed = { method: "POST", path: "/v1/execute", body: "{", contentType: "application/json" } as const;
  for (let i = 0; i <= BURST_PER_MINUTE + 1; i++) {
    try {
      await once.transport.request(malformed, "json");
    } catch (e) {
      if (e instanceof RateLimitedError) return e;
      if (!(e instanceof InvalidJsonError)) throw e;
    }
  }
  throw new Error(`no 429 after ${BURST_PER_MINUTE + 2} requests`);
}

test("a 429 is retried when its Retry-After is within the bound, as many times as allowed", async () => {
  const refused = await exhaust();
  assert.ok(refused.retryAfterMs !== undefined && refused.retryAfterMs <= 2000, String(refused.retryAfterMs));
  // Within the bound: waited for, sent again, answered.
  const counter = counting();
  const patient = new Airlock({ baseUrl: server().url, apiKey: BURST, maxRetries: 3, maxRetryWaitMs: 5000, fetch: counter.fetch });
  assert.equal((await patient.run("1 + 1")).result, 2);
  assert.ok(counter.count() >= 2, `sent ${counter.count()} times`);
  // Past the bound (a shorter wait than the server asks): thrown at once.
  await exhaust();
  const hasty = counting();
  const impatient = new Airlock({ baseUrl: server().url, apiKey: BURST, maxRetries: 3, maxRetryWaitMs: 100, fetch: hasty.fetch });
  await assert.rejects(impatient.run("1"), RateLimitedError);
  assert.equal(hasty.count(), 1);
  // No retries allowed: thrown at once too.
  await exhaust();
  const none = counting();
  const never = new Airlock({ baseUrl: server().url, apiKey: BURST, maxRetries: 0, maxRetryWaitMs: 5000, fetch: none.fetch });
  await assert.rejects(never.run("1"), RateLimitedError);
  assert.equal(none.count(), 1);
});

test("refusals of the transport's own requests have their classes", async () => {
  const t = client.transport;
  await assert.rejects(t.request({ method: "POST", path: "/v1/execute", body: "{", contentType: "application/json" }, "json"), InvalidJsonError);
  await assert.rejects(t.request({ method: "POST", path: "/v1/execute", body: "1", contentType: "text/plain" }, "json"), UnsupportedMediaTypeError);
  await assert.rejects(t.request({ method: "GET", path: "/v1/sessions/se_nobody" }, "json"), NotFoundError);
  await assert.rejects(t.request({ method: "DELETE", path: "/v1/eval" }, "json"), MethodNotAllowedError);
  // 413: client.test.ts, against a server whose limit a body can pass while it still fits in
  // the connection's buffers (64 MiB sent here raced the server's close: EPIPE).
});

test("a session's conflicts are 409s of their own class", async () => {
  const t = client.transport;
  const opened = await t.request({ method: "POST", path: "/v1/sessions", json: {}, ok: [201] }, "json");
  const id = (opened.body as { id: string }).id;
  const cell = (code: string) => t.request({ method: "POST", path: `/v1/sessions/${id}/execute`, json: { code } }, "json");
  try {
    // One request at a time: a cell while another runs is session_busy.
    const events = await t.events({ method: "POST", path: `/v1/sessions/${id}/execute`, json: { code: "import time\nprint('in', flush=True)\ntime.sleep(30)" } });
    const iterator = events[Symbol.asyncIterator]();
    await iterator.next();
    await assert.rejects(cell("1"), (e: unknown) => e instanceof SessionBusyError && e instanceof ConflictError && e.status === 409);
    events.close();
  } finally {
    await t.request({ method: "DELETE", path: `/v1/sessions/${id}`, ok: [204] }, "none").catch(() => undefined);
  }
  const again = await t.request({ method: "POST", path: "/v1/sessions", json: {}, ok: [201] }, "json");
  const other = (again.body as { id: string }).id;
  try {
    await t.request({ method: "POST", path: `/v1/sessions/${other}/execute`, json: { code: "import sys\nsys.exit(3)" } }, "json");
    await assert.rejects(
      t.request({ method: "POST", path: `/v1/sessions/${other}/execute`, json: { code: "1" } }, "json"),
      SessionEndedError,
    );
  } finally {
    await t.request({ method: "DELETE", path: `/v1/sessions/${other}`, ok: [204] }, "none").catch(() => undefined);
  }
});

test("an error page that is not airlock's is a ProtocolError quoting it, never a crash", async () => {
  const page = await htmlErrorPage(502);
  try {
    const behind = new Airlock({ baseUrl: page.url, apiKey: KEY });
    await assert.rejects(behind.run("1"), (e: unknown) => {
      assert.ok(e instanceof ProtocolError);
      assert.equal(e.status, 502);
      assert.match(e.message, /HTTP 502 .*text\/html.*502 Bad Gateway/);
      assert.ok(!e.message.includes("\u001b"), "control characters are not passed on");
      return true;
    });
  } finally {
    await page.close();
  }
});

test("each code has its class and status; an unknown code keeps it as an AirlockError", () => {
  const json = new Headers({ "content-type": "application/json", "x-request-id": "rq_1", "retry-after": "3" });
  for (const [code, [Class, status]] of Object.entries(ERROR_CODES)) {
    const e = errorFromAnswer({ status, headers: json, body: JSON.stringify({ error: { code, message: "m", field: "f" } }) });
    assert.ok(e instanceof Class && e instanceof AirlockError && e instanceof Error, code);
    assert.deepEqual([e.code, e.status, e.requestId, e.field, e.retryAfterMs], [code, status, "rq_1", "f", 3000]);
  }
  const unknown = errorFromAnswer({ status: 418, headers: json, body: '{"error": {"code": "teapot", "message": "short"}}' });
  assert.equal(unknown.constructor, AirlockError);
  assert.deepEqual([unknown.code, unknown.status], ["teapot", 418]);
});

test("Retry-After is seconds or an HTTP date", () => {
  const now = Date.parse("Wed, 21 Oct 2015 07:28:00 GMT");
  assert.equal(retryAfterMs("120", now), 120_000);
  assert.equal(retryAfterMs("Wed, 21 Oct 2015 07:28:05 GMT", now), 5000);
  assert.equal(retryAfterMs("Wed, 21 Oct 2015 07:27:00 GMT", now), 0);
  assert.equal(retryAfterMs("soon", now), undefined);
  assert.equal(retryAfterMs("-1", now), undefined);
  assert.equal(retryAfterMs(null, now), undefined);
});
