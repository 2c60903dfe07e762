// The AI SDK adapter against a real `airlock serve`, driven by the SDK's own tool loop
// (`generateText` with `stopWhen`) and its mock model from `ai/test`: the model's code runs in
// the sandbox, the next turn of the model reads the tool's text, failures come back as text,
// refusals as the SDK's tool errors, and hostile code stays contained.

import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { generateText, isStepCount } from "ai";
import { pythonREPL, pythonTool } from "../src/adapters/ai-sdk.js";
import { Airlock } from "../src/index.js";
import { assertContained, assertPng, assertSandboxed, charts, hostile, probe, serve, sessionsOf, WRONG_KEY } from "./adapters-common.js";
import { scripted, toolResults } from "./adapters-mock-model.js";
import { NODE_22, delegate } from "./adapters-node22.js";

if (!NODE_22) {
  delegate(import.meta.url);
} else {
  const served = serve();

  test("ai-sdk: the one-shot tool runs each call in a fresh sandbox; the model reads the text", async () => {
    const marker = join(mkdtempSync(join(tmpdir(), "airlock-adapters-")), "pwned");
    const model = scripted("python", ["y = 2 ** 10\ny", "y", probe(served.server.url), hostile(marker), "```python\nprint('fenced')\n```"]);
    const seen: unknown[] = [];
    const result = await generateText({
      model,
      tools: { python: pythonTool({ client: served.airlock, onExecution: (e) => seen.push(e) }) },
      stopWhen: isStepCount(10),
      prompt: "compute",
    });
    const [first, second, third, fourth, fifth] = result.text.split("\n---\n");
    assert.equal(first, "result: 1024");
    assert.ok(second?.startsWith("status: error"), second);
    assert.match(second ?? "", /NameError: name 'y' is not defined/); // nothing kept between calls
    assertSandboxed(third ?? "");
    assertContained(fourth ?? "", marker);
    assert.equal(fifth, "stdout:\nfenced");
    assert.equal(seen.length, 5); // the program got every whole execution
    // The SDK sent the model the tool's schema: one required string, `code`.
    const tools = model.doGenerateCalls[0]?.tools ?? [];
    assert.equal(tools.length, 1);
    const [definition] = tools as { name: string; inputSchema: { required: string[] } }[];
    assert.equal(definition?.name, "python");
    assert.deepEqual(definition?.inputSchema.required, ["code"]);
  });

  test("ai-sdk: the text says what happened, bounded, and keeps charts and files out", async () => {
    const code =
      "import matplotlib.pyplot as plt, os\nplt.plot([1, 2, 3]); plt.show()\n" +
      "os.makedirs('outputs', exist_ok=True); open('outputs/data.csv', 'w').write('a,b')\n" +
      "print('x' * 100_000)\n[2 ** 70, float('nan')]";
    const model = scripted("python", [code]);
    const seen: { outputs: { type: string; data: unknown }[] }[] = [];
    const result = await generateText({
      model,
      tools: { python: pythonTool({ client: served.airlock, maxChars: 2000, onExecution: (e) => seen.push(e) }) },
      stopWhen: isStepCount(3),
      prompt: "plot",
    });
    const text = result.text;
    assert.ok(text.length <= 2000, `${text.length} characters`);
    assert.match(text, /characters cut/);
    assert.match(text, /result: \[1180591620717411303424, nan\]/);
    assert.match(text, /\[1 display output\(s\) not shown here: image\/png\]/);
    assert.match(text, /\[files left in \.\/outputs: data\.csv\]|\[files left in \.\/outputs: outputs\/data\.csv\]/);
    assert.ok(!text.includes("iVBOR"), "no image bytes in the model's text");
    // The chart itself went to the program.
    assert.equal(seen[0]?.outputs[0]?.type, "image/png");
    assert.ok(String(seen[0]?.outputs[0]?.data).startsWith("iVBOR"));
  });

  test("ai-sdk: with images, the model's next turn gets the charts as image parts, within the bounds", async () => {
    const model = scripted("python", [charts(1), charts(3)]);
    const seen: { outputs: { type: string; data: unknown }[] }[] = [];
    await generateText({
      model,
      tools: { python: pythonTool({ client: served.airlock, images: { max: 2 }, onExecution: (e) => seen.push(e) }) },
      stopWhen: isStepCount(5),
      prompt: "plot",
    });
    // The last turn of the model was shown both calls' results.
    const [one, three] = toolResults(model.doGenerateCalls[2]?.prompt) as { output: { type: string; value: Part[] } }[];
    type Part = { type: string; text?: string; mediaType?: string; data?: { type: string; data: string } };
    assert.equal(one?.output.type, "content");
    assert.deepEqual(one?.output.value.map((p) => p.type), ["text", "file"]);
    assert.equal(one?.output.value[0]?.text, "stdout:\ndrawn\n[1 chart(s) attached as image(s)]");
    const chart = one?.output.value[1];
    assert.equal(chart?.mediaType, "image/png");
    assertPng(chart?.data?.data);
    assert.equal(chart?.data?.data, seen[0]?.outputs[0]?.data); // the execution's own chart
    // Three charts, two handed over: the third is named, as without images.
    assert.deepEqual(three?.output.value.map((p) => p.type), ["text", "file", "file"]);
    assert.equal(
      three?.output.value[0]?.text,
      "stdout:\ndrawn\n[2 chart(s) attached as image(s)]\n[1 display output(s) not shown here: image/png]",
    );
    assert.deepEqual(three?.output.value.slice(1).map((p) => p.data?.data), seen[1]?.outputs.slice(0, 2).map((o) => o.data));
  });

  test("ai-sdk: with images, a chart over the byte bound and a call without charts answer text", async () => {
    const model = scripted("python", [charts(1), "print('no chart')"]);
    await generateText({
      model,
      tools: { python: pythonTool({ client: served.airlock, images: { maxBytes: 100 } }) },
      stopWhen: isStepCount(5),
      prompt: "plot",
    });
    const shown = toolResults(model.doGenerateCalls[2]?.prompt).map((r) => r.output);
    assert.deepEqual(shown, [
      { type: "text", value: "stdout:\ndrawn\n[1 display output(s) not shown here: image/png]" },
      { type: "text", value: "stdout:\nno chart" },
    ]);
  });

  test("ai-sdk: a refusal by the server is a tool error the model reads", async () => {
    const wrong = new Airlock({ baseUrl: served.server.url, apiKey: WRONG_KEY });
    const model = scripted("python", ["1"]);
    const result = await generateText({
      model,
      tools: { python: pythonTool({ client: wrong }) },
      stopWhen: isStepCount(3),
      prompt: "go",
    });
    const [shown] = toolResults(model.doGenerateCalls[1]?.prompt);
    assert.equal(shown?.output.type, "error-text");
    assert.match(String(shown?.output.value), /401|unauthorized|key/i);
    assert.match(result.text, /401|unauthorized|key/i);
  });

  test("ai-sdk: an abort of the run cancels the tool's request", async () => {
    const controller = new AbortController();
    const model = scripted("python", ["import time\ntime.sleep(30)"]);
    const started = generateText({
      model,
      tools: { python: pythonTool({ client: served.airlock }) },
      stopWhen: isStepCount(3),
      prompt: "sleep",
      abortSignal: controller.signal,
    });
    setTimeout(() => controller.abort(), 500);
    await assert.rejects(started, (e: unknown) => e instanceof Error && /abort/i.test(`${e.name} ${e.message}`));
  });

  test("ai-sdk: the session tool keeps state between the model's calls", async (t) => {
    const sessions = sessionsOf(served.airlock);
    if (sessions === undefined) {
      t.skip("the client has no sessions yet");
      return;
    }
    const model = scripted("python_repl", ["x = 6 * 7", "x"]);
    const repl = pythonREPL({ client: sessions });
    try {
      const result = await generateText({ model, tools: { python_repl: repl.tool }, stopWhen: isStepCount(5), prompt: "go" });
      assert.equal(result.text, "(the code ran and printed nothing)\n---\nresult: 42");
      assert.ok(repl.sessionId);
    } finally {
      await repl.close();
    }
    assert.equal(repl.sessionId, undefined);
  });
}
