// The OpenAI Agents SDK adapter against a real `airlock serve`, driven by the SDK's own runner
// (`run()`) with a scripted `Model` (the SDK's model interface, no network): the model's code
// runs in the sandbox, its next turn reads the function call's output, refusals go through the
// SDK's `errorFunction`.

import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Agent, run, setTracingDisabled } from "@openai/agents";
import { pythonREPL, pythonTool } from "../src/adapters/openai-agents.js";
import { Airlock } from "../src/index.js";
import { assertContained, assertPng, assertSandboxed, charts, hostile, probe, serve, sessionsOf, WRONG_KEY } from "./adapters-common.js";
import { ScriptedModel } from "./adapters-mock-model.js";
import { NODE_22, delegate } from "./adapters-node22.js";

setTracingDisabled(true); // no trace export (it would need the network and an OpenAI key)

if (!NODE_22) {
  delegate(import.meta.url);
} else {
  const served = serve();

  test("openai-agents: run() drives the one-shot tool; the model reads each output", async () => {
    const marker = join(mkdtempSync(join(tmpdir(), "airlock-adapters-")), "pwned");
    const model = new ScriptedModel("python", ["y = 2 ** 10\ny", "y", probe(served.server.url), hostile(marker)]);
    const agent = new Agent({ name: "analyst", model, tools: [pythonTool({ client: served.airlock })] });
    const result = await run(agent, "compute");
    const [first, second, third, fourth] = String(result.finalOutput).split("\n---\n");
    assert.equal(first, "result: 1024");
    assert.ok(second?.startsWith("status: error"));
    assert.match(second ?? "", /NameError: name 'y' is not defined/);
    assertSandboxed(third ?? "");
    assertContained(fourth ?? "", marker);
    const definition = model.requests[0]?.tools[0] as { name: string; parameters: { required: string[] }; strict: boolean };
    assert.equal(definition.name, "python");
    assert.deepEqual(definition.parameters.required, ["code"]);
    assert.equal(definition.strict, true);
  });

  test("openai-agents: a refusal goes through errorFunction, or the SDK's default", async () => {
    const wrong = new Airlock({ baseUrl: served.server.url, apiKey: WRONG_KEY });
    const refusal = (_context: unknown, error: unknown): string => `refused: ${(error as { status?: number }).status}`;
    let model = new ScriptedModel("python", ["1"]);
    let result = await run(new Agent({ name: "a", model, tools: [pythonTool({ client: wrong, errorFunction: refusal })] }), "go");
    assert.equal(result.finalOutput, "refused: 401");

    model = new ScriptedModel("python", ["1"]);
    result = await run(new Agent({ name: "a", model, tools: [pythonTool({ client: wrong })] }), "go");
    assert.match(String(result.finalOutput), /error occurred while running the tool/i);
  });

  test("openai-agents: with images, the model's next turn gets the chart as an input_image", async () => {
    const model = new ScriptedModel("python", [charts(1), "print('no chart')"]);
    const result = await run(new Agent({ name: "a", model, tools: [pythonTool({ client: served.airlock, images: true })] }), "plot");
    assert.equal(result.finalOutput, "stdout:\ndrawn\n[1 chart(s) attached as image(s)]\n---\nstdout:\nno chart");
    const items = Array.isArray(model.requests[2]?.input) ? model.requests[2].input : [];
    const [drawn, plain] = items.flatMap((i) => (i.type === "function_call_result" ? [i.output as unknown] : []));
    assert.deepEqual(plain, { type: "text", text: "stdout:\nno chart" }); // no chart: text as ever (the SDK's form)
    const parts = drawn as { type: string; text?: string; image?: unknown }[];
    assert.deepEqual(parts.map((p) => p.type), ["input_text", "input_image"]);
    const image = String(parts[1]?.image);
    assert.ok(image.startsWith("data:image/png;base64,"), image.slice(0, 40));
    assertPng(image.slice("data:image/png;base64,".length));
  });

  test("openai-agents: the session tool keeps state between calls", async (t) => {
    const sessions = sessionsOf(served.airlock);
    if (sessions === undefined) {
      t.skip("the client has no sessions yet");
      return;
    }
    const model = new ScriptedModel("python_repl", ["x = 6 * 7", "x"]);
    const repl = pythonREPL({ client: sessions });
    try {
      const result = await run(new Agent({ name: "a", model, tools: [repl.tool] }), "go");
      assert.equal(result.finalOutput, "(the code ran and printed nothing)\n---\nresult: 42");
    } finally {
      await repl.close();
    }
  });
}
