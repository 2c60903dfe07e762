// The error codes a real server sends only in particular states, provoked through the client's
// public methods: a body that stalls (408), a Host the server does not answer for (421), a
// full server (503 `overloaded`, retried as its Retry-After says), a store it cannot read
// (503 `unavailable`), a paused session's snapshot damaged on disk (422 `snapshot_invalid`;
// gone, 500 `internal`), a sandbox that cannot take its snapshot (422 `snapshot_failed`), a
// server that cannot pause (422 `snapshots_unavailable`) or make volumes (422
// `volumes_unavailable`), a session open when its server was killed (410 `session_lost`), a
// request refused while the server stops (503 `shutting_down`), and `/mcp`'s 406.

import { before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import {
  AirlockError,
  Airlock,
  InternalError,
  MisdirectedRequestError,
  NotAcceptableError,
  OverloadedError,
  RequestTimeoutError,
  ServiceUnavailableError,
  SessionLostError,
  ShuttingDownError,
  SnapshotFailedError,
  SnapshotInvalidError,
  SnapshotsUnavailableError,
  UnavailableError,
  UnprocessableError,
  VolumesUnavailableError,
  type ExecutionStream,
  type Fetch,
  type Session,
} from "../src/index.js";
import { KEY, cgroups, eventually, launch, useServer, type Server } from "./harness.js";

// One running slot and no queue (a second execution is refused at once), and a body timeout
// short enough to wait for.
const BODY_TIMEOUT_MS = 1000;
const server = useServer({
  extra: `[http]\nbody_timeout_ms = ${BODY_TIMEOUT_MS}\n[concurrency]\nmax_running = 1\nmax_queue = 0\n`,
});
let client: Airlock;

before(async () => {
  client = new Airlock({ baseUrl: (await server.ready()).url, apiKey: KEY });
});

/** A `fetch` that notes the status of each answer it passes on from the real one. */
function noting(): { fetch: Fetch; statuses: number[] } {
  const statuses: number[] = [];
  return {
    fetch: async (input, init) => {
      const response = await fetch(input, init);
      statuses.push(response.status);
      return response;
    },
    statuses,
  };
}

/** Checks what every error answer of the server carries: its class, code and status, and the
 * request id the server's log names it by. */
function refusal<T extends AirlockError>(
  Class: abstract new (...args: never[]) => T,
  code: string,
  status: number,
  check?: (e: T) => void,
): (e: unknown) => boolean {
  return (e: unknown) => {
    assert.ok(e instanceof Class, `${String(e)} is not a ${Class.name}`);
    assert.ok(e instanceof AirlockError);
    assert.equal(e.code, code, e.message);
    assert.equal(e.status, status, e.message);
    assert.match(e.requestId ?? "", /^rq_/, "the request id");
    check?.(e);
    return true;
  };
}

/** A running execution holding the server's one slot, until closed. */
async function holdTheSlot(c: Airlock): Promise<ExecutionStream> {
  const holder = c.stream("import time\nprint('holding', flush=True)\ntime.sleep(60)");
  const first = await holder[Symbol.asyncIterator]().next();
  assert.ok(!first.done && first.value.type === "stdout", "the holder started");
  return holder;
}

test("a body that stalls past the server's body timeout is a RequestTimeoutError (408)", async () => {
  const s = await client.session();
  try {
    // Half a file, then nothing: the server stops waiting after its body timeout.
    let sent = false;
    const stalled = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (!sent) {
          sent = true;
          controller.enqueue(new TextEncoder().encode("the first half, "));
        }
        return new Promise<void>(() => undefined);
      },
    });
    await assert.rejects(s.upload("stalled.txt", stalled), refusal(RequestTimeoutError, "timeout", 408));
    // Nothing of it was written, and the session goes on.
    assert.equal((await s.run("import os\nos.path.exists('stalled.txt')")).result, false);
  } finally {
    await s.close();
  }
});

test("a Host the server does not answer for is a MisdirectedRequestError (421)", async () => {
  // The same server at an address it does not list: its IPv4-mapped IPv6 form, which fetch
  // sends as the Host (fetch itself may not set Host).
  const port = new URL(server().url).port;
  const elsewhere = new Airlock({ baseUrl: `http://[::ffff:127.0.0.1]:${port}`, apiKey: KEY });
  await assert.rejects(elsewhere.run("print('never')"), refusal(MisdirectedRequestError, "misdirected_request", 421));
});

test("a full server is an OverloadedError (503) with Retry-After, retried within the bounds", async () => {
  const holder = await holdTheSlot(client);
  try {
    const url = server().url;
    // No retries: thrown at once, saying when to come back.
    const once = noting();
    const never = new Airlock({ baseUrl: url, apiKey: KEY, maxRetries: 0, fetch: once.fetch });
    await assert.rejects(
      never.run("1"),
      refusal(OverloadedError, "overloaded", 503, (e) => {
        assert.ok(e instanceof ServiceUnavailableError);
        assert.equal(e.retryAfterMs, 1000);
      }),
    );
    assert.deepEqual(once.statuses, [503]);
    await assert.rejects(never.stream("1").result(), OverloadedError);
    // Within the bounds: sent again as many times as allowed, then thrown.
    const twice = noting();
    const patient = new Airlock({ baseUrl: url, apiKey: KEY, maxRetries: 2, maxRetryWaitMs: 5000, fetch: twice.fetch });
    await assert.rejects(patient.run("1"), OverloadedError);
    assert.deepEqual(twice.statuses, [503, 503, 503]);
    // A wait longer than the caller allows: thrown at once.
    const hasty = noting();
    const impatient = new Airlock({ baseUrl: url, apiKey: KEY, maxRetries: 5, maxRetryWaitMs: 500, fetch: hasty.fetch });
    await assert.rejects(impatient.run("1"), OverloadedError);
    assert.deepEqual(hasty.statuses, [503]);
    // Waiting, and answered once the slot is free again.
    const waited = noting();
    const waiting = new Airlock({ baseUrl: url, apiKey: KEY, maxRetries: 60, maxRetryWaitMs: 5000, fetch: waited.fetch });
    const ran = waiting.run("6 * 7");
    await eventually("a refusal", async () => (waited.statuses.length > 0 ? true : undefined));
    holder.close();
    assert.equal((await ran).result, 42);
    assert.equal(waited.statuses[0], 503);
    assert.equal(waited.statuses.at(-1), 200);
  } finally {
    holder.close();
  }
});

test("a store the server cannot read is an UnavailableError (503), retried as Retry-After says", async () => {
  // An environment's name file that is not JSON: the store is damaged, not the request.
  const names = join(server().dir, "state", "environments", "names");
  mkdirSync(names, { recursive: true });
  const broken = join(names, "broken.json");
  writeFileSync(broken, "{ not json");
  try {
    const noted = noting();
    const c = new Airlock({ baseUrl: server().url, apiKey: KEY, maxRetries: 2, maxRetryWaitMs: 5000, fetch: noted.fetch });
    await assert.rejects(
      c.environments.show("broken"),
      refusal(UnavailableError, "unavailable", 503, (e) => {
        assert.ok(e instanceof ServiceUnavailableError);
        assert.equal(e.retryAfterMs, 1000);
      }),
    );
    assert.deepEqual(noted.statuses, [503, 503, 503]);
  } finally {
    unlinkSync(broken);
  }
});

/** A session of `c` paused with `marker` set, and its snapshot's file on disk. */
async function pausedWithMarker(c: Airlock, dir: string, marker: string): Promise<{ session: Session; snapshot: string }> {
  const session = await c.session();
  await session.run(`marker = ${JSON.stringify(marker)}`);
  await session.pause();
  const sessions = join(dir, "state", "sessions");
  const record = JSON.parse(readFileSync(join(sessions, `${session.id}.json`), "utf8")) as { snapshot_file: string };
  return { session, snapshot: join(sessions, record.snapshot_file) };
}

test("a paused session whose snapshot was altered is a SnapshotInvalidError (422)", async () => {
  const { session, snapshot } = await pausedWithMarker(client, server().dir, "a");
  try {
    const bytes = readFileSync(snapshot);
    const middle = Math.floor(bytes.length / 2);
    bytes[middle] = (bytes[middle] ?? 0) ^ 0x40;
    writeFileSync(snapshot, bytes);
    const invalid = refusal(SnapshotInvalidError, "snapshot_invalid", 422, (e) => assert.ok(e instanceof UnprocessableError));
    await assert.rejects(session.run("marker"), invalid);
    await assert.rejects(session.resume(), invalid);
    // Put back as it was, it comes back.
    bytes[middle] = (bytes[middle] ?? 0) ^ 0x40;
    writeFileSync(snapshot, bytes);
    assert.equal((await session.run("marker")).result, "a");
  } finally {
    await session.close();
  }
});

test("a paused session whose snapshot's file is gone is an InternalError (500)", async () => {
  const { session, snapshot } = await pausedWithMarker(client, server().dir, "b");
  try {
    unlinkSync(snapshot);
    await assert.rejects(session.resume(), refusal(InternalError, "internal", 500));
    // The server goes on.
    assert.equal((await client.run("1 + 1")).result, 2);
  } finally {
    await session.close();
  }
});

test("a snapshot the session's sandbox cannot take is a SnapshotFailedError (422), and the session runs on", async () => {
  const s = await client.session();
  try {
    // The cell runs in the runner's interpreter: it can break what the snapshot is written with.
    await s.run("import tarfile\ndef refuse(*a, **k):\n    raise OSError('no archive today')\ntarfile.open = refuse\nkept = 7");
    await assert.rejects(
      s.pause(),
      refusal(SnapshotFailedError, "snapshot_failed", 422, (e) => {
        assert.ok(e instanceof UnprocessableError);
        assert.match(e.message, /no archive today/);
      }),
    );
    assert.equal((await s.run("kept")).result, 7);
  } finally {
    await s.close();
  }
});

test("a server that cannot keep snapshots answers a pause with SnapshotsUnavailableError (422)", async () => {
  // The key its snapshots are sealed with is damaged (not 32 bytes): pausing is unavailable.
  const dir = mkdtempSync(join(tmpdir(), "airlock-test-ts-nosnap-"));
  let s: Server | undefined;
  try {
    mkdirSync(join(dir, "state", "sessions"), { recursive: true, mode: 0o700 });
    writeFileSync(join(dir, "state", "sessions", ".key"), "short", { mode: 0o600 });
    s = await launch({ dir });
    const session = await new Airlock({ baseUrl: s.url, apiKey: KEY }).session();
    try {
      await session.run("x = 1");
      await assert.rejects(
        session.pause(),
        refusal(SnapshotsUnavailableError, "snapshots_unavailable", 422, (e) => assert.match(e.message, /cannot be paused/)),
      );
      assert.equal((await session.run("x")).result, 1);
    } finally {
      await session.close();
    }
  } finally {
    await s?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a session open when its server was killed is a SessionLostError (410) after the restart", async () => {
  const dir = mkdtempSync(join(tmpdir(), "airlock-test-ts-lost-"));
  let current: Server | undefined;
  try {
    current = await launch({ dir });
    const url = current.url;
    const c = new Airlock({ baseUrl: url, apiKey: KEY });
    const session = await c.session();
    await session.run("x = 1");
    const killed = current.pid;
    await current.kill(); // SIGKILL
    current = await launch({ dir, listen: url.replace(/^http:\/\//, "") });
    const lost = refusal(SessionLostError, "session_lost", 410, (e) => assert.match(e.message, /restart/));
    await assert.rejects(session.run("x"), lost);
    await assert.rejects(c.sessionById(session.id), lost);
    await assert.rejects(session.files(), lost);
    // Closing a lost session is not an error.
    await session.close();
    await current.stop();
    current = undefined;
    // The killed server's sandboxes were swept by the next one.
    assert.deepEqual(cgroups().filter((p) => p.split("/").pop()?.startsWith(`airlock-${killed}-`)), []);
  } finally {
    await current?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a request refused while the server stops is a ShuttingDownError (503, Retry-After: 5)", async () => {
  const s = await launch({ extra: "shutdown_grace_ms = 2000\n[concurrency]\nmax_running = 1\nmax_queue = 4\n" });
  let stopping: Promise<void> | undefined;
  try {
    // A wait longer than the caller allows: the refusal is not sent again.
    const c = new Airlock({ baseUrl: s.url, apiKey: KEY, maxRetryWaitMs: 1000 });
    const holder = await holdTheSlot(c);
    try {
      // Queued behind the holder when the server is told to stop.
      const queued = c.run("print('never')");
      await eventually("the run queued", async () => ((await metrics(s)).includes("airlock_queue_depth 1\n") ? true : undefined));
      stopping = s.stop();
      await assert.rejects(
        queued,
        refusal(ShuttingDownError, "shutting_down", 503, (e) => {
          assert.ok(e instanceof ServiceUnavailableError);
          assert.equal(e.retryAfterMs, 5000);
        }),
      );
    } finally {
      holder.close();
    }
  } finally {
    await (stopping ?? s.stop());
  }
});

test("a server without loop devices answers a new volume with VolumesUnavailableError (422)", async () => {
  // The server in a mount namespace of its own whose /dev/loop-control cannot be opened for
  // writing, as on a host without loop devices.
  const dir = mkdtempSync(join(tmpdir(), "airlock-test-ts-novolumes-"));
  const readOnly = join(dir, "read-only");
  writeFileSync(readOnly, "");
  let s: Server | undefined;
  try {
    s = await launch({
      wrap: (argv) => [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount --bind "$0" /dev/loop-control && mount -o remount,bind,ro /dev/loop-control && exec "$@"',
        readOnly,
        ...argv,
      ],
    });
    const c = new Airlock({ baseUrl: s.url, apiKey: KEY });
    await assert.rejects(
      c.volumes.create("data", 16 << 20),
      refusal(VolumesUnavailableError, "volumes_unavailable", 422, (e) => assert.match(e.message, /loop device/)),
    );
    // Everything else works.
    assert.equal((await c.run("6 * 7")).result, 42);
  } finally {
    await s?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("/mcp, which no method of the client calls, refuses a request that does not take event streams (406)", async () => {
  // Through the transport, which code that builds on the client may use.
  const initialize = {
    jsonrpc: "2.0",
    id: 1,
    method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "test", version: "0" } },
  };
  await assert.rejects(
    client.transport.request({ method: "POST", path: "/mcp", json: initialize }, "json"),
    refusal(NotAcceptableError, "not_acceptable", 406),
  );
});

/** The server's Prometheus metrics. */
async function metrics(s: Server): Promise<string> {
  const response = await fetch(`${s.url}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } });
  return response.text();
}
