import { before, test } from "node:test";
import assert from "node:assert/strict";

import {
  Airlock,
  ClientTimeoutError,
  ForbiddenError,
  NotFoundError,
  ProtocolError,
  TransportError,
  type Approval,
  type StreamEvent,
} from "../src/index.js";
import { APPROVER, EXECUTE_ONLY, KEY, eventually, useServer } from "./harness.js";
import { cuttingProxy } from "./proxy.js";

const server = useServer();
let client: Airlock;

before(async () => {
  client = new Airlock({ baseUrl: (await server.ready()).url, apiKey: KEY });
});

/** The server's count of sandboxes running now (`/metrics`). */
async function running(): Promise<number> {
  const answer = await client.transport.request({ method: "GET", path: "/metrics" }, "bytes");
  const text = new TextDecoder().decode(answer.body);
  const found = /^airlock_running_sandboxes(?:\{[^}]*\})? ([0-9.]+)$/m.exec(text);
  assert.ok(found, "airlock_running_sandboxes is in /metrics");
  return Number(found[1]);
}

const SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(120)";

test("a connection cut mid-stream ends the iterator with a TransportError", async () => {
  const proxy = await cuttingProxy(server().url, "started");
  try {
    const behind = new Airlock({ baseUrl: proxy.url, apiKey: KEY });
    const seen: StreamEvent[] = [];
    await assert.rejects(
      (async () => {
        for await (const event of behind.stream(SLEEPER)) seen.push(event);
      })(),
      (e: unknown) => {
        assert.ok(e instanceof TransportError, String(e));
        assert.match(e.message, /lost mid-stream/);
        return true;
      },
    );
    assert.deepEqual(seen, [{ type: "stdout", text: "started\n" }]);
    // The server saw its client go and killed the sandbox.
    await eventually("the sandbox killed", async () => ((await running()) === 0 ? true : undefined));
  } finally {
    await proxy.close();
  }
});

test("a stream cut before its first event is an error, never a silent end", async () => {
  // The proxy cuts once the answer's head is through, before any event: with the
  // connection closed cleanly at a chunk's end, or not, the iterator must not end silently.
  const proxy = await cuttingProxy(server().url, "text/event-stream");
  try {
    const behind = new Airlock({ baseUrl: proxy.url, apiKey: KEY });
    await assert.rejects(behind.stream(SLEEPER).result(), (e: unknown) => e instanceof TransportError || e instanceof ProtocolError);
  } finally {
    await proxy.close();
  }
});

test("aborting a run rejects with the signal's reason and kills its sandbox", async () => {
  const controller = new AbortController();
  const call = client.run(SLEEPER, { signal: controller.signal });
  await eventually("the sandbox running", async () => ((await running()) === 1 ? true : undefined));
  const reason = new Error("the user left");
  controller.abort(reason);
  await assert.rejects(call, (e: unknown) => e === reason);
  await eventually("the sandbox killed", async () => ((await running()) === 0 ? true : undefined));
  // A signal aborted already stops the call before it is sent.
  await assert.rejects(client.eval("1", { signal: AbortSignal.abort(reason) }), (e: unknown) => e === reason);
});

test("aborting a stream, or its timeout, ends it and kills its sandbox", async () => {
  const controller = new AbortController();
  const seen: StreamEvent[] = [];
  await assert.rejects(
    (async () => {
      for await (const event of client.stream(SLEEPER, { signal: controller.signal })) {
        seen.push(event);
        controller.abort();
      }
    })(),
    (e: unknown) => e instanceof DOMException && e.name === "AbortError",
  );
  assert.equal(seen.length, 1);
  await eventually("the sandbox killed", async () => ((await running()) === 0 ? true : undefined));
  await assert.rejects(client.stream(SLEEPER, { timeoutMs: 1500 }).result(), ClientTimeoutError);
  await eventually("the sandbox killed", async () => ((await running()) === 0 ? true : undefined));
  await assert.rejects(client.run(SLEEPER, { timeoutMs: 1500 }), ClientTimeoutError);
  await eventually("the sandbox killed", async () => ((await running()) === 0 ? true : undefined));
});

test("leaving a stream early disconnects and kills its sandbox", async () => {
  for await (const event of client.stream(SLEEPER)) {
    assert.deepEqual(event, { type: "stdout", text: "started\n" });
    break;
  }
  await eventually("the sandbox killed", async () => ((await running()) === 0 ? true : undefined));
  assert.equal((await client.run("1")).result, 1);
});

test("a stream reports truncation", async () => {
  const stream = client.stream("print('x' * 5000)", { limits: { output_bytes: 1000 } });
  const events: StreamEvent[] = [];
  for await (const e of stream) events.push(e);
  assert.ok(events.some((e) => e.type === "truncated" && e.stream === "stdout" && e.limit === 1000));
  const e = await stream.result();
  assert.ok(e.stdout_truncated);
  assert.equal(e.stdout, "x".repeat(1000));
});

const NOTE =
  "import tools\ntry:\n    out = ['ok', tools.crm.write_note(text=%s)]\n" +
  "except tools.ToolError as e:\n    out = [e.kind, str(e)]\nout";

test("approvals: announced by a stream, decided once by another key, denied with a reason", async () => {
  const agent = new Airlock({ baseUrl: server().url, apiKey: EXECUTE_ONLY });
  const boss = new Airlock({ baseUrl: server().url, apiKey: APPROVER });
  await assert.rejects(agent.approvals(), ForbiddenError);
  const seen: Approval[] = [];
  const stream = agent.stream(NOTE.replace("%s", "'streamed'"), {
    onApproval: async (a) => {
      seen.push(a);
      const decided = await boss.approve(a.id, "fine");
      assert.equal(decided.decision, "approve");
      assert.equal(decided.decided_by, "approver");
    },
  });
  const events: StreamEvent[] = [];
  for await (const e of stream) events.push(e);
  assert.equal(seen.length, 1);
  const [first] = seen;
  assert.deepEqual(first?.arguments, { text: "streamed" });
  assert.equal(first?.arguments_preview, '{"text":"streamed"}');
  assert.equal(first?.arguments_shown, "whole");
  assert.equal(first?.key, "execute-only");
  assert.equal(first?.tool, "write_note");
  assert.equal(first?.line, 3);
  assert.ok(events.some((e) => e.type === "approval" && e.approval.id === first?.id));
  assert.deepEqual(stream.execution?.result, ["ok", "written"]);
  await assert.rejects(boss.approve(first?.id ?? ""), NotFoundError);
  // Denied, while run() waits.
  const done = agent.run(NOTE.replace("%s", "'denied'"));
  const waiting = await eventually("a call waiting", async () => {
    const list = await boss.approvals();
    return list.length > 0 ? list : undefined;
  });
  assert.deepEqual(waiting[0]?.arguments, { text: "denied" });
  const detail = await boss.approval(waiting[0]?.id ?? "");
  assert.deepEqual(detail.arguments, { text: "denied" });
  assert.deepEqual(detail.approval, waiting[0]);
  await boss.deny(waiting[0]?.id ?? "", "not today");
  const result = (await done).result;
  assert.ok(Array.isArray(result));
  assert.equal(result[0], "denied");
  assert.match(String(result[1]), /not today/);
  assert.deepEqual(await boss.approvals(), []);
  await assert.rejects(boss.deny("ap_0123", "gone"), NotFoundError);
});

test("an onApproval that throws ends the stream with its error", async () => {
  const agent = new Airlock({ baseUrl: server().url, apiKey: EXECUTE_ONLY });
  const boss = new Airlock({ baseUrl: server().url, apiKey: APPROVER });
  const oops = new Error("the handler failed");
  const stream = agent.stream(NOTE.replace("%s", "'x'"), {
    onApproval: async (a) => {
      await boss.deny(a.id, "handler");
      throw oops;
    },
  });
  await assert.rejects(stream.result(), (e: unknown) => e === oops);
});
