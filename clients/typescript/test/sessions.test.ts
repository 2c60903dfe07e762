// Sessions against the real server: state kept across cells, files in and out byte for byte,
// pause/resume/fork, the busy and unknown sessions' errors, and a paused session found again
// after a restart.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";

import {
  Airlock,
  ExecutionFailedError,
  ForbiddenError,
  InvalidRequestError,
  NotFoundError,
  Session,
  SessionBusyError,
  SessionEndedError,
  type StreamEvent,
} from "../src/index.js";
import { KEY, OTHER, launch, type Server } from "./harness.js";
import { acrossRestart } from "./restart.js";

// Session downloads are capped at half the result limit: 4 MiB here, for a file of a few MB.
const BIGGER_RESULTS = "[engine]\nmax_result_bytes = 8388608\n";

let server: Server;
let client: Airlock;

before(async () => {
  server = await launch({ extra: BIGGER_RESULTS });
  client = new Airlock({ baseUrl: server.url, apiKey: KEY });
});

after(async () => {
  await server.stop();
});

async function readAll(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

function sha256(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

test("a session keeps its state across cells, and ends", async () => {
  const s = await client.session({ env: { X: "1" }, files: { "seed.txt": "s" }, idle_timeout_ms: 60_000 });
  assert.ok(s instanceof Session);
  assert.match(s.id, /^se_/);
  assert.equal(s.info.cells, 0);
  assert.equal(s.info.ended ?? null, null);
  assert.equal(s.info.idle_timeout_ms, 60_000);
  assert.ok((await s.run("import os\nx = int(os.environ['X']) + 1")).ok);
  const cell = await s.run("x * 10");
  assert.equal(cell.result, 20);
  assert.equal(cell.session_ended, false);
  assert.match(cell.id, /^ex_/);
  assert.equal(await s.call("def f(y):\n    return x + y", "f", { y: 5 }), 7);
  await assert.rejects(s.call("def g():\n    raise KeyError('k')", "g"), ExecutionFailedError);
  assert.equal((await s.run("open('seed.txt').read()")).result, "s");
  const events: StreamEvent[] = [];
  for await (const e of s.stream("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.1)\nx")) events.push(e);
  assert.equal(events.flatMap((e) => (e.type === "stdout" ? [e.text] : [])).join(""), "0\n1\n2\n");
  const last = events.at(-1);
  assert.ok(last?.type === "result" && last.execution.result === 2);
  assert.ok((await client.sessions()).some((i) => i.id === s.id));
  assert.equal((await s.refresh()).cells, 6);
  assert.equal((await client.sessionById(s.id)).info.cells, s.info.cells);

  const ended = await s.run("import sys\nsys.exit(3)");
  assert.equal(ended.session_ended, true);
  assert.equal(ended.status, "error");
  await assert.rejects(s.run("1"), (e: unknown) => {
    assert.ok(e instanceof SessionEndedError);
    assert.equal(e.status, 409);
    assert.equal(e.code, "session_ended");
    return true;
  });
  assert.equal((await s.refresh()).ended, "error");
  await s.close();
  assert.ok(s.closed);
  await assert.rejects(s.refresh(), NotFoundError);
  await s.close(); // twice is fine
});

test("a cell's own timeout ends the session", async () => {
  const s = await client.session();
  try {
    const cell = await s.run("import time\ntime.sleep(5)", { timeout_ms: 300 });
    assert.equal(cell.status, "timeout");
    assert.equal(cell.session_ended, true);
    assert.deepEqual(cell.limits_hit, ["wall_time"]);
  } finally {
    await s.close();
  }
});

test("files go in and out byte for byte: every byte value, and a few MB", async () => {
  const s = await client.session();
  try {
    const every = new Uint8Array(256 * 64).map((_, i) => i % 256);
    const big = new Uint8Array(randomBytes(3 << 20));
    await s.upload("data/every.bin", every);
    await s.upload("big.bin", big);
    await s.upload("text.txt", "héllo €\u{1F600}");
    await s.upload("empty.bin", new Uint8Array(0));
    // Read in the sandbox: the bytes are the ones sent.
    const seen = await s.run(
      "import hashlib\n" +
        "[hashlib.sha256(open(p, 'rb').read()).hexdigest() for p in ['data/every.bin', 'big.bin']] + " +
        "[open('text.txt', encoding='utf-8').read(), len(open('empty.bin', 'rb').read())]",
    );
    assert.deepEqual(seen.result, [sha256(every), sha256(big), "héllo €\u{1F600}", 0]);
    // Written in the sandbox (bytes that are not UTF-8), read back here whole and as a stream.
    await s.run("open('made.bin', 'wb').write(bytes(range(255, -1, -1)) * 3)");
    const made = await s.download("made.bin");
    assert.equal(made.length, 768);
    assert.deepEqual(made.subarray(0, 4), new Uint8Array([255, 254, 253, 252]));
    assert.deepEqual(await s.download("data/every.bin"), every);
    assert.deepEqual(await s.download("big.bin"), big);
    assert.deepEqual(await readAll(await s.downloadStream("big.bin")), big);
    assert.deepEqual(await s.download("empty.bin"), new Uint8Array(0));
    assert.equal(new TextDecoder().decode(await s.download("text.txt")), "héllo €\u{1F600}");
    // Uploads from a stream and a Blob.
    const chunks = [every.subarray(0, 1000), every.subarray(1000)];
    await s.upload(
      "streamed.bin",
      new ReadableStream<Uint8Array>({
        pull(c) {
          const next = chunks.shift();
          if (next === undefined) c.close();
          else c.enqueue(next);
        },
      }),
    );
    assert.deepEqual(await s.download("streamed.bin"), every);
    await s.upload("blob.bin", new Blob([big.subarray(0, 5000)]));
    assert.deepEqual(await s.download("blob.bin"), big.subarray(0, 5000));

    const entries = new Map((await s.files()).map((f) => [f.path, f]));
    for (const p of ["data", "data/every.bin", "big.bin", "text.txt", "made.bin", "streamed.bin"]) assert.ok(entries.has(p), p);
    assert.equal(entries.get("big.bin")?.size, 3 << 20);
    assert.equal(entries.get("big.bin")?.type, "file");
    assert.equal(entries.get("data")?.type, "dir");

    await assert.rejects(s.download("missing.txt"), NotFoundError);
    await s.run("import os\nos.symlink('/etc/passwd', 'link')");
    await assert.rejects(s.download("link"), InvalidRequestError);
    assert.equal((await s.files()).find((f) => f.path === "link")?.type, "link");
    // Refused here, before any request.
    await assert.rejects(s.download("../etc/passwd"), TypeError);
    await assert.rejects(s.upload("a//b", "x"), TypeError);
  } finally {
    await s.close();
  }
});

const STATE =
  "import threading\nx = 42\nrows = [1, 2, 3]\ndef f(n):\n    return n + x\n" +
  "lock = threading.Lock()\nopen('/work/notes.txt', 'w').write('in work')\n'ready'";
const CHECK = "[x, rows, f(1), open('/work/notes.txt').read(), 'lock' in globals()]";

test("pause and resume keep the state; a fork goes its own way", async () => {
  const s = await client.session();
  try {
    assert.equal((await s.run(STATE)).result, "ready");
    const paused = await s.pause();
    assert.equal(paused, s.info);
    assert.ok(paused.paused);
    assert.equal(paused.paused.cells, 1);
    assert.ok(["x", "rows", "f"].every((v) => paused.paused?.variables.includes(v)));
    assert.deepEqual(Object.keys(paused.paused.not_kept), ["lock"]);
    assert.ok((await client.sessions()).find((i) => i.id === s.id)?.paused);
    // The next cell brings it back: every value but what could not be kept.
    const back = await s.run(CHECK);
    assert.deepEqual(back.result, [42, [1, 2, 3], 43, "in work", false]);
    assert.deepEqual(Object.keys(back.resumed?.not_kept ?? {}), ["lock"]);
    assert.equal((await s.run("x")).resumed ?? null, null);
    // `resume` brings it back without a cell; of an open session it brings nothing.
    assert.equal((await s.resume()).resumed ?? null, null);
    await s.pause();
    const resumed = await s.resume();
    assert.equal(resumed.paused ?? null, null);
    assert.ok(resumed.resumed);

    const fork = await s.fork();
    try {
      assert.notEqual(fork.id, s.id);
      assert.ok(fork.info.resumed?.variables.includes("rows"));
      assert.deepEqual((await fork.run("[x, rows, f(1)]")).result, [42, [1, 2, 3], 43]);
      await fork.run("x = 1000\nrows.append(4)\nopen('/work/notes.txt', 'w').write('fork')");
      await fork.upload("only-fork.txt", "f");
      assert.deepEqual((await s.run("[f(1), rows, open('/work/notes.txt').read()]")).result, [43, [1, 2, 3], "in work"]);
      assert.deepEqual((await fork.run("[f(1), rows, open('/work/notes.txt').read()]")).result, [1001, [1, 2, 3, 4], "fork"]);
      await assert.rejects(s.download("only-fork.txt"), NotFoundError);
    } finally {
      await fork.close();
    }
    await assert.rejects(fork.refresh(), NotFoundError);
    // A paused session forks too, and stays paused.
    await s.pause();
    const second = await s.fork();
    assert.deepEqual((await second.run("rows")).result, [1, 2, 3]);
    await second.close();
    assert.ok((await s.refresh()).paused);
    // Its files are reached while paused (it is brought back first).
    assert.equal(new TextDecoder().decode(await s.download("notes.txt")), "in work");
  } finally {
    await s.close();
  }
});

test("a busy session answers 409, and unknown or another key's sessions 404", async () => {
  const s = await client.session();
  try {
    const slow = s.stream("import time\nprint('go', flush=True)\ntime.sleep(1.5)\n'slept'");
    const it = slow[Symbol.asyncIterator]();
    assert.deepEqual((await it.next()).value, { type: "stdout", text: "go\n" });
    for (const busy of [() => s.run("1"), () => s.pause(), () => s.fork(), () => s.upload("x", "x")]) {
      await assert.rejects(busy(), (e: unknown) => {
        assert.ok(e instanceof SessionBusyError, String(e));
        assert.deepEqual([e.status, e.code], [409, "session_busy"]);
        return true;
      });
    }
    for (;;) if ((await it.next()).done) break;
    assert.equal(slow.execution?.result, "slept");

    const other = new Airlock({ baseUrl: server.url, apiKey: OTHER });
    await assert.rejects(other.sessionById(s.id), NotFoundError);
    const theirs = new Session(other.transport, s.info);
    await assert.rejects(theirs.run("1"), NotFoundError);
    await assert.rejects(theirs.download("x"), NotFoundError);
  } finally {
    await s.close();
  }
  await assert.rejects(client.sessionById("se_nosuchsession"), (e: unknown) => {
    assert.ok(e instanceof NotFoundError);
    assert.deepEqual([e.status, e.code], [404, "not_found"]);
    return true;
  });
  await assert.rejects(s.run("1"), NotFoundError);
  await assert.rejects(client.sessionById(".."), TypeError);
});

test("a session is opened with the run options: limits and credentials", async () => {
  const s = await client.session({ limits: { memory_mb: 256, timeout_ms: 5000 }, credentials: [] });
  try {
    assert.equal(s.info.limits.memory_mb, 256);
    assert.equal(s.info.limits.timeout_ms, 5000);
  } finally {
    await s.close();
  }
  await assert.rejects(client.session({ credentials: ["github"] }), (e: unknown) => {
    assert.ok(e instanceof ForbiddenError);
    assert.equal(e.field, "credentials");
    return true;
  });
  await assert.rejects(client.session({ max_lifetime_ms: 10 }), InvalidRequestError);
});

test("a paused session is there after a restart", async () => {
  await acrossRestart(
    async (first) => {
      const s = await new Airlock({ baseUrl: first.url, apiKey: KEY }).session();
      await s.run(STATE);
      await s.pause();
      return s.id;
    },
    async (second, id) => {
      const c = new Airlock({ baseUrl: second.url, apiKey: KEY });
      const same = await c.sessionById(id);
      assert.equal(same.info.paused?.cells, 1);
      assert.deepEqual((await same.run(CHECK)).result, [42, [1, 2, 3], 43, "in work", false]);
      await same.close();
      await assert.rejects(c.sessionById(id), NotFoundError);
    },
  );
});
