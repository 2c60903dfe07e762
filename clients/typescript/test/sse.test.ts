import { test } from "node:test";
import assert from "node:assert/strict";

import { readEvents, SseParser, type SseEvent } from "../src/sse.js";
import { ProtocolError } from "../src/errors.js";

/** The events of `text` fed to the reader in the given pieces (as bytes). */
async function events(pieces: (string | Uint8Array)[]): Promise<SseEvent[]> {
  const encoder = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const p of pieces) controller.enqueue(typeof p === "string" ? encoder.encode(p) : p);
      controller.close();
    },
  });
  const out: SseEvent[] = [];
  for await (const e of readEvents(body)) out.push(e);
  return out;
}

const STREAM = ': keep-alive\r\nevent: stdout\r\nid: 7\r\ndata: {"text":"a"}\r\n\r\nevent: result\ndata: line one\ndata: line two\nretry: 1500\n\n';

test("events are the same however the bytes are cut", async () => {
  const whole = await events([STREAM]);
  assert.deepEqual(whole, [
    { event: "stdout", data: '{"text":"a"}', id: "7", retry: undefined },
    { event: "result", data: "line one\nline two", id: "7", retry: 1500 },
  ]);
  const bytes = new TextEncoder().encode(STREAM);
  // Every single cut, CRLFs split between two chunks included.
  for (let i = 1; i < bytes.length; i++) {
    assert.deepEqual(await events([bytes.subarray(0, i), bytes.subarray(i)]), whole, `cut at ${i}`);
  }
  // A byte at a time.
  assert.deepEqual(await events([...bytes].map((b) => new Uint8Array([b]))), whole);
});

test("a character split between chunks is whole; CR alone ends lines; comments and unknown fields are skipped", async () => {
  const text = new TextEncoder().encode('data: {"text":"é€😀"}\r\rfoo: bar\rdata\r\r');
  const got = await events([text.subarray(0, 15), text.subarray(15, 17), text.subarray(17)]);
  assert.deepEqual(got.map((e) => e.data), ['{"text":"é€😀"}', ""]);
  assert.deepEqual(got.map((e) => e.event), ["message", "message"]);
});

test("an event cut off by the stream's end is not dispatched; an event with no data is not one", async () => {
  assert.deepEqual(await events(["event: x\n\n", "data: whole\n\n", "data: cut"]), [
    { event: "message", data: "whole", id: undefined, retry: undefined },
  ]);
});

test("an event over the limit is refused, as is an event stream that is not UTF-8", async () => {
  const parser = new SseParser(10);
  assert.throws(() => parser.feed("data: 0123456789\n"), ProtocolError);
  await assert.rejects(events([new Uint8Array([0x64, 0x61, 0x74, 0x61, 0x3a, 0xff, 0x0a, 0x0a])]), ProtocolError);
});
