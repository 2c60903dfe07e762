// Background executions against the real server: `submit` and `wait` give what `run` gives,
// `events()` resumes after dropped connections with every event once (and from a kept id,
// elsewhere), `cancel` kills and deletes, a result is read again after a restart, and a
// follower goes on across a crash.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import {
  Airlock,
  BackgroundExecution,
  BackgroundNotFinishedError,
  InvalidRequestError,
  LimitAboveCeilingError,
  NotFoundError,
  StorageFullError,
  WaitTimeoutError,
  InterruptedError,
  type BackgroundEvent,
  type Fetch,
} from "../src/index.js";
import { KEY, OTHER, launch, sleep, type Server } from "./harness.js";
import { acrossRestart } from "./restart.js";

// 50 lines over about 2.5 s on stdout, every fifth echoed on stderr; characters of 1 to 4 bytes.
const CHATTY =
  "import sys, time\n" +
  "for i in range(50):\n" +
  "    print(f'out {i} é€😀', flush=True)\n" +
  "    if i % 5 == 0:\n" +
  "        sys.stderr.write(f'err {i}\\n'); sys.stderr.flush()\n" +
  "    time.sleep(0.05)\n" +
  "'done'";
const CHATTY_OUT = Array.from({ length: 50 }, (_, i) => `out ${i} é€😀\n`).join("");
const CHATTY_ERR = Array.from({ length: 10 }, (_, i) => `err ${i * 5}\n`).join("");
const LONG = "import time\nprint('started', flush=True)\ntime.sleep(600)";

let server: Server;
let client: Airlock;

before(async () => {
  server = await launch();
  client = new Airlock({ baseUrl: server.url, apiKey: KEY });
});

after(async () => {
  await server.stop();
});

function texts(events: readonly BackgroundEvent[], stream: "stdout" | "stderr"): string {
  return events.map((e) => (e.type === stream ? e.text : "")).join("");
}

async function all(events: AsyncIterable<BackgroundEvent>): Promise<BackgroundEvent[]> {
  const seen: BackgroundEvent[] = [];
  for await (const e of events) seen.push(e);
  return seen;
}

/** A `fetch` that cuts the first `times` connections to an execution's events after
 * `chunks` chunks and half of the next (mid-event, most likely), as a network that drops
 * would; it records the `Last-Event-ID` each connection sent. */
function cutting(times = 8, chunks = 2): { fetch: Fetch; sent: (string | null)[]; cuts: () => number } {
  const sent: (string | null)[] = [];
  let cuts = 0;
  const f: Fetch = async (input, init) => {
    const response = await fetch(input, init);
    if (!new URL(input).pathname.endsWith("/events")) return response;
    sent.push(new Headers(init.headers).get("last-event-id"));
    if (sent.length > times || response.body === null) return response;
    const reader = response.body.getReader();
    let read = 0;
    let cut = false;
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        if (cut) {
          // The half chunk was given: now the connection is gone.
          await reader.cancel().catch(() => undefined);
          controller.error(new TypeError("cut by the test"));
          return;
        }
        const { done, value } = await reader.read();
        if (done) return controller.close();
        if (read === chunks) {
          controller.enqueue(value.subarray(0, Math.floor(value.length / 2)));
          cuts += 1;
          cut = true;
          return;
        }
        read += 1;
        controller.enqueue(value);
      },
      cancel: (reason) => reader.cancel(reason),
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
  return { fetch: f, sent, cuts: () => cuts };
}

test("submit then wait gives what run gives", async () => {
  const code = "import sys\nprint('hello')\nprint('warn', file=sys.stderr)\n{'x': [1, 2.5, None], 'n': 'é'}";
  const ran = await client.run(code);
  const h = await client.submit(code, { limits: { memory_mb: 256 } });
  assert.ok(h instanceof BackgroundExecution);
  assert.match(h.id, /^ex_/);
  assert.ok(h.info && ["queued", "running"].includes(h.info.state));
  assert.equal(h.info.result, undefined);
  assert.equal(h.info.limits.memory_mb, 256);
  assert.equal(h.info.limits.timeout_ms, 3_600_000, "the background default");
  const e = await h.wait();
  assert.equal(e.id, h.id);
  assert.notEqual(e.output_streamed, true);
  for (const field of ["status", "stdout", "stderr", "result", "resultJson", "error", "exit_code", "limits_hit", "ok"] as const) {
    assert.deepEqual(e[field], ran[field], field);
  }
  const info = await h.refresh();
  assert.equal(info.state, "finished");
  assert.ok(info.ended && info.started_at && info.ended_at);
  assert.equal(info.error, undefined);
  // A handle by id, from anywhere, waits no more.
  assert.deepEqual(await client.background(h.id).wait(), e);
  // Refusals throw as run's do, before anything is kept.
  for (const call of [client.run.bind(client), client.submit.bind(client)]) {
    await assert.rejects(call("1", { limits: { memory_mb: 1e9 } }), (err: unknown) => {
      assert.ok(err instanceof LimitAboveCeilingError);
      assert.equal(err.field, "limits.memory_mb");
      return true;
    });
  }
  assert.equal((await h.cancel()).state, "finished");
});

test("events resume after dropped connections with every event once", async () => {
  const cutter = cutting();
  const c = new Airlock({ baseUrl: server.url, apiKey: KEY, fetch: cutter.fetch });
  const h = await c.submit(CHATTY);
  const events = h.events();
  const seen: BackgroundEvent[] = [];
  for await (const event of events) {
    seen.push(event);
    assert.equal(events.lastEventId, event.id);
  }
  assert.equal(texts(seen, "stdout"), CHATTY_OUT);
  assert.equal(texts(seen, "stderr"), CHATTY_ERR);
  const ids = seen.map((e) => BigInt(e.id));
  assert.ok(ids.every((id, i) => i === 0 || id > (ids[i - 1] ?? 0n)), "ids grow, each once");
  const last = seen.at(-1);
  assert.ok(last?.type === "result");
  assert.ok(last.execution.ok);
  assert.equal(last.execution.result, "done");
  assert.equal(last.execution.output_streamed, true);
  assert.equal(last.execution.stdout, "");
  assert.equal(last.execution.id, h.id);
  // Every connection after the first resumed after an event it had given, with its id.
  assert.ok(cutter.cuts() >= 3, `cut ${cutter.cuts()} times`);
  assert.equal(events.reconnections, cutter.cuts());
  assert.equal(cutter.sent.length, events.reconnections + 1);
  assert.equal(cutter.sent[0], null);
  for (const sent of cutter.sent.slice(1)) assert.ok(sent !== null && seen.some((e) => e.id === sent), String(sent));

  // Another client, from a kept id: the rest once, then nothing after the last.
  const again = client.background(h.id);
  const half = Math.floor(seen.length / 2);
  const rest = await all(again.events({ after: seen[half - 1]?.id }));
  assert.equal(rest.length, seen.length - half);
  assert.equal(texts(seen.slice(0, half), "stdout") + texts(rest, "stdout"), CHATTY_OUT);
  assert.equal(texts(seen.slice(0, half), "stderr") + texts(rest, "stderr"), CHATTY_ERR);
  assert.deepEqual(await all(again.events({ after: last.id })), []);
  await assert.rejects(all(again.events({ after: String(BigInt(last.id) - 1n) })), (e: unknown) => {
    assert.ok(e instanceof InvalidRequestError);
    assert.equal(e.field, "Last-Event-ID");
    return true;
  });
  assert.throws(() => again.events({ after: "x1" }), TypeError);
  const e = await again.wait();
  assert.deepEqual([e.stdout, e.stderr, e.result], [CHATTY_OUT, CHATTY_ERR, "done"]);
  await again.cancel();
});

test("cancel kills a long run and deletes it", async () => {
  const running = await client.submit(LONG);
  const queued = await client.submit("print('never')"); // one runs at a time: this one waits
  const first = await running.events()[Symbol.asyncIterator]().next();
  assert.deepEqual(first.value && { type: first.value.type, text: "text" in first.value && first.value.text }, { type: "stdout", text: "started\n" });
  assert.equal((await queued.refresh()).state, "queued");
  // A waiter elsewhere sees it end.
  const waiter = client.background(running.id).wait().then(
    () => undefined,
    (e: unknown) => e,
  );
  await sleep(300);

  let info = await queued.cancel();
  assert.equal(info.state, "cancelled");
  assert.equal(info.started_at, undefined);
  assert.equal(info.error?.code, "cancelled");
  info = await running.cancel();
  assert.equal(info.state, "cancelled");
  assert.ok(info.ended_at);
  assert.equal(await running.cancel(), info, "cancelled once");
  // The waiter read its last event, then found it cancelled or already deleted.
  const ended = await waiter;
  assert.ok(ended instanceof BackgroundNotFinishedError || ended instanceof NotFoundError, String(ended));
  if (ended instanceof BackgroundNotFinishedError) assert.equal(ended.state, "cancelled");

  // Gone: its state, events and result, from any handle.
  for (const h of [running, queued, client.background(running.id)]) await assert.rejects(h.refresh(), NotFoundError);
  await assert.rejects(all(client.background(running.id).events()), NotFoundError);
  await assert.rejects(client.background(running.id).cancel(), NotFoundError);
  // Its own handle says how it ended.
  await assert.rejects(running.wait(), (e: unknown) => {
    assert.ok(e instanceof BackgroundNotFinishedError);
    assert.equal(e.state, "cancelled");
    assert.equal(e.executionId, running.id);
    assert.match(e.message, /cancelled/);
    return true;
  });
  await assert.rejects(queued.wait(), (e: unknown) => e instanceof BackgroundNotFinishedError && e.code === "cancelled");
  assert.equal((await client.run("1")).result, 1);
});

test("a wait's timeout leaves it running; another key sees nothing", async () => {
  const h = await client.submit(LONG);
  await assert.rejects(h.wait({ timeoutMs: 500 }), (e: unknown) => {
    assert.ok(e instanceof WaitTimeoutError);
    assert.equal(e.executionId, h.id);
    return true;
  });
  assert.ok(["queued", "running"].includes((await h.refresh()).state), "it goes on");
  // A caller's signal stops a follower, not the execution.
  const stop = new AbortController();
  const reason = new Error("stopped by the caller");
  setTimeout(() => stop.abort(reason), 300);
  await assert.rejects(all(h.events({ signal: stop.signal })), (e: unknown) => e === reason);
  const other = new Airlock({ baseUrl: server.url, apiKey: OTHER });
  const theirs = other.background(h.id);
  await assert.rejects(theirs.refresh(), NotFoundError);
  await assert.rejects(theirs.wait(), NotFoundError);
  await assert.rejects(theirs.cancel(), NotFoundError);
  await assert.rejects(all(theirs.events()), NotFoundError);
  assert.ok(["queued", "running"].includes((await h.refresh()).state));
  assert.equal((await h.cancel()).state, "cancelled");
  // A handle by id asks nothing until used.
  const nothing = client.background("ex_nothing_here");
  assert.equal(nothing.info, undefined);
  await assert.rejects(nothing.wait(), NotFoundError);
  assert.throws(() => client.background(".."), TypeError);
});

test("one that fails ends its events with the error, and wait throws the server's reason", async () => {
  // 10 MiB of output against a key's 8 MiB of stored background work: stopped, `failed`.
  const other = new Airlock({ baseUrl: server.url, apiKey: OTHER });
  const h = await other.submit("import sys\nfor _ in range(160):\n    sys.stdout.write('z' * 65536); sys.stdout.flush()", {
    limits: { output_bytes: 16 << 20 },
  });
  await assert.rejects(h.wait({ timeoutMs: 60_000 }), (e: unknown) => {
    assert.ok(e instanceof BackgroundNotFinishedError);
    assert.equal(e.state, "failed");
    assert.equal(e.code, "storage_full");
    assert.match(e.message, /max_bytes_per_key/);
    return true;
  });
  // Its events end as its state does: an `error` naming storage_full.
  const last = (await all(h.events())).at(-1);
  assert.ok(last?.type === "error", JSON.stringify(last));
  assert.equal(last.code, "storage_full");
  assert.ok(last.error instanceof StorageFullError);
  const info = await h.refresh();
  assert.equal(info.state, "failed");
  assert.equal(info.error?.code, "storage_full");
  await h.cancel();
});

test("a result is read again after the server restarts", async () => {
  await acrossRestart(
    async (first) => {
      const h = await new Airlock({ baseUrl: first.url, apiKey: KEY }).submit("print('kept')\n{'v': 6 * 7, 's': 'é'}");
      const ran = await h.wait();
      return { id: h.id, ran, seen: await all(h.events()) };
    },
    async (second, { id, ran, seen }) => {
      const c = new Airlock({ baseUrl: second.url, apiKey: KEY });
      const again = c.background(id);
      const info = await again.refresh();
      assert.equal(info.state, "finished");
      assert.deepEqual(info.result, ran);
      assert.deepEqual(await again.wait(), ran);
      assert.equal(ran.id, id);
      assert.equal(ran.stdout, "kept\n");
      assert.deepEqual(ran.result, { v: 42, s: "é" });
      // The same events, each once (read by another request: its own request id).
      const unread = (events: BackgroundEvent[]): unknown[] =>
        events.map((e) => (e.type === "result" ? { ...e, execution: { ...e.execution, requestId: undefined } } : e));
      assert.deepEqual(unread(await all(again.events())), unread(seen));
      await again.cancel();
      await assert.rejects(c.background(id).refresh(), NotFoundError);
    },
  );
});

test("a follower goes on across a crash and restart, and the run is interrupted", async () => {
  const dir = mkdtempSync(join(tmpdir(), "airlock-test-ts-background-"));
  let current: Server | undefined;
  try {
    current = await launch({ dir });
    const url = current.url;
    const c = new Airlock({ baseUrl: url, apiKey: KEY });
    const h = await c.submit(LONG);
    const events = h.events();
    const it = events[Symbol.asyncIterator]();
    const first = await it.next();
    assert.ok(!first.done && first.value.type === "stdout" && first.value.text === "started\n");
    const kept = events.lastEventId;
    await current.kill(); // SIGKILL: the server cleans up nothing
    // Back on the same address, from the same state, before the follower reads on.
    current = await launch({ dir, listen: url.replace(/^http:\/\//, "") });
    assert.equal(current.url, url);
    // The same iterator: its connection lost, it reconnects after the last event it gave, and
    // the execution's log ends with how it ended.
    const rest: BackgroundEvent[] = [];
    for (let next = await it.next(); !next.done; next = await it.next()) rest.push(next.value);
    assert.ok(events.reconnections >= 1);
    assert.notEqual(events.lastEventId, kept);
    assert.equal(rest.length, 1);
    const error = rest[0];
    assert.ok(error?.type === "error");
    assert.equal(error.code, "interrupted");
    assert.ok(error.error instanceof InterruptedError);
    await assert.rejects(h.wait(), (e: unknown) => {
      assert.ok(e instanceof BackgroundNotFinishedError);
      assert.equal(e.state, "interrupted");
      assert.match(e.message, /submit it again/);
      return true;
    });
    assert.equal((await h.cancel()).state, "interrupted");
  } finally {
    await current?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
