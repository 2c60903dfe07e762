// The Mastra adapter against a real `airlock serve`, driven by a Mastra `Agent`'s own loop
// (`agent.generate`) with the AI SDK's mock model (`ai/test`, which Mastra accepts as a model):
// the model's code runs in the sandbox and its next turn reads the tool's text.

import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Agent } from "@mastra/core/agent";
import { pythonREPL, pythonTool } from "../src/adapters/mastra.js";
import { assertContained, assertPng, assertSandboxed, charts, hostile, probe, serve, sessionsOf } from "./adapters-common.js";
import { scripted, toolResults } from "./adapters-mock-model.js";
import { NODE_22, delegate } from "./adapters-node22.js";

if (!NODE_22) {
  delegate(import.meta.url);
} else {
  const served = serve();

  test("mastra: an Agent runs the one-shot tool; the model reads each result", async () => {
    const marker = join(mkdtempSync(join(tmpdir(), "airlock-adapters-")), "pwned");
    const model = scripted("python", ["y = 6 * 7\nprint('set')\ny", "y", probe(served.server.url), hostile(marker)]);
    const agent = new Agent({
      id: "analyst",
      name: "analyst",
      instructions: "Use Python.",
      model: model as never, // ai@7's own copy of @ai-sdk/provider types; Mastra's differs by a patch
      tools: { python: pythonTool({ client: served.airlock }) },
    });
    const result = await agent.generate("compute", { maxSteps: 10 });
    const [first, second, third, fourth] = result.text.split("\n---\n");
    assert.equal(first, "stdout:\nset\nresult: 42");
    assert.match(second ?? "", /NameError: name 'y' is not defined/);
    assertSandboxed(third ?? "");
    assertContained(fourth ?? "", marker);
    const tools = ([...model.doGenerateCalls, ...model.doStreamCalls][0]?.tools ?? []) as { name: string; inputSchema: { required?: string[] } }[];
    assert.equal(tools[0]?.name, "python");
    assert.deepEqual(tools[0]?.inputSchema.required, ["code"]);
  });

  test("mastra: with images, the model's next turn gets the chart", async () => {
    const model = scripted("python", [charts(1)]);
    const agent = new Agent({
      id: "a",
      name: "a",
      instructions: "Use Python.",
      model: model as never,
      tools: { python: pythonTool({ client: served.airlock, images: true }) },
    });
    await agent.generate("plot", { maxSteps: 5 });
    const calls = [...model.doGenerateCalls, ...model.doStreamCalls];
    const [shown] = toolResults(calls[1]?.prompt);
    type Part = { type: string; text?: string; mediaType?: string; data?: { data?: unknown } };
    assert.equal(shown?.output.type, "content");
    const parts = shown?.output.value as Part[];
    assert.deepEqual(parts.map((p) => p.type), ["text", "file"]);
    assert.equal(parts[0]?.text, "stdout:\ndrawn\n[1 chart(s) attached as image(s)]");
    assert.equal(parts[1]?.mediaType, "image/png");
    assertPng(parts[1]?.data?.data);
  });

  test("mastra: the session tool keeps state between calls", async (t) => {
    const sessions = sessionsOf(served.airlock);
    if (sessions === undefined) {
      t.skip("the client has no sessions yet");
      return;
    }
    const repl = pythonREPL({ client: sessions });
    try {
      const model = scripted("python_repl", ["x = 6 * 7", "x"]);
      const agent = new Agent({ id: "a", name: "a", instructions: "Use Python.", model: model as never, tools: { python_repl: repl.tool } });
      const result = await agent.generate("go", { maxSteps: 5 });
      assert.equal(result.text, "(the code ran and printed nothing)\n---\nresult: 42");
    } finally {
      await repl.close();
    }
  });
}
