// The LangChain.js adapter against a real `airlock serve`, driven by LangChain's own agent
// loop (`createAgent` of the `langchain` package) with a scripted chat model built on
// `@langchain/core`'s `BaseChatModel`: the model's code runs in the sandbox, its next turn
// reads the ToolMessage, the artifact carries the whole execution, refusals are tool errors.

import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { AIMessage, ToolMessage } from "@langchain/core/messages";
import { createAgent } from "langchain";
import { pythonREPL, pythonTool } from "../src/adapters/langchain.js";
import { Airlock } from "../src/index.js";
import { assertContained, assertPng, assertSandboxed, charts, hostile, probe, serve, sessionsOf, WRONG_KEY } from "./adapters-common.js";
import { ScriptedChatModel, call } from "./adapters-mock-model.js";
import { NODE_22, delegate } from "./adapters-node22.js";

if (!NODE_22) {
  delegate(import.meta.url);
} else {
  const served = serve();

  test("langchain: createAgent runs the one-shot tool; ToolMessages carry the text, artifacts the execution", async () => {
    const marker = join(mkdtempSync(join(tmpdir(), "airlock-adapters-")), "pwned");
    const model = new ScriptedChatModel([
      call("python", "y = 6 * 7\nprint('set')\ny", 1),
      call("python", "y", 2),
      call("python", probe(served.server.url), 3),
      call("python", hostile(marker), 4),
      new AIMessage("done"),
    ]);
    const agent = createAgent({ model, tools: [pythonTool({ client: served.airlock })] });
    const { messages } = await agent.invoke({ messages: [{ role: "user", content: "probe the sandbox" }] });

    assert.equal(model.bound[0]?.function.name, "python");
    assert.deepEqual((model.bound[0]?.function.parameters as { required?: string[] }).required, ["code"]);
    const results = messages.filter((m): m is ToolMessage => ToolMessage.isInstance(m));
    assert.deepEqual(results.map((m) => m.tool_call_id), ["call_1", "call_2", "call_3", "call_4"]);
    assert.equal(results[0]?.content, "stdout:\nset\nresult: 42");
    assert.match(String(results[1]?.content), /NameError: name 'y' is not defined/); // a fresh sandbox each call
    assertSandboxed(String(results[2]?.content));
    assertContained(String(results[3]?.content), marker);
    // The artifact is the whole execution, for the program.
    const artifact = results[0]?.artifact as { status: string; isolation: { network: string } };
    assert.equal(artifact.status, "ok");
    assert.equal(artifact.isolation.network, "none");
    // The model's next turn was shown the tool's text.
    const shown = model.seen[1]?.filter((m) => ToolMessage.isInstance(m)).map((m) => m.content);
    assert.deepEqual(shown, ["stdout:\nset\nresult: 42"]);
    assert.equal(messages.at(-1)?.content, "done");
  });

  test("langchain: with images, the model's next turn gets the chart as an image block", async () => {
    const model = new ScriptedChatModel([call("python", charts(1), 1), call("python", "print('no chart')", 2), new AIMessage("done")]);
    const agent = createAgent({ model, tools: [pythonTool({ client: served.airlock, images: true })] });
    const { messages } = await agent.invoke({ messages: [{ role: "user", content: "plot" }] });
    const [drawn, plain] = model.seen[2]?.filter((m) => ToolMessage.isInstance(m)).map((m) => m.content) ?? [];
    type Block = { type: string; text?: string; mimeType?: string; data?: string };
    assert.ok(Array.isArray(drawn), JSON.stringify(drawn));
    const blocks = drawn as Block[];
    assert.deepEqual(blocks.map((b) => b.type), ["text", "image"]);
    assert.equal(blocks[0]?.text, "stdout:\ndrawn\n[1 chart(s) attached as image(s)]");
    assert.equal(blocks[1]?.mimeType, "image/png");
    assertPng(blocks[1]?.data);
    assert.equal(plain, "stdout:\nno chart"); // no chart: text as ever
    // The artifact is still the whole execution, its chart included.
    const artifact = messages.filter((m): m is ToolMessage => ToolMessage.isInstance(m))[0]?.artifact as { outputs: { data: string }[] };
    assert.equal(artifact.outputs[0]?.data, blocks[1]?.data);
  });

  test("langchain: invoked directly, with fences and a tool call", async () => {
    const python = pythonTool({ client: served.airlock });
    assert.equal(await python.invoke({ code: "```python\ny = 5\nprint(y)\n```" }), "stdout:\n5");
    const message = (await python.invoke({ type: "tool_call", id: "c1", name: "python", args: { code: "1/0" } })) as ToolMessage;
    assert.ok(ToolMessage.isInstance(message));
    assert.match(String(message.content), /ZeroDivisionError: division by zero/);
    assert.equal((message.artifact as { status: string }).status, "error");
  });

  test("langchain: a refusal by the server is thrown from the tool", async () => {
    const python = pythonTool({ client: new Airlock({ baseUrl: served.server.url, apiKey: WRONG_KEY }) });
    await assert.rejects(python.invoke({ code: "1" }), (e: unknown) => (e as { status?: number }).status === 401);
  });

  test("langchain: the session tool keeps state between calls", async (t) => {
    const sessions = sessionsOf(served.airlock);
    if (sessions === undefined) {
      t.skip("the client has no sessions yet");
      return;
    }
    const repl = pythonREPL({ client: sessions });
    try {
      assert.equal(await repl.tool.invoke({ code: "z = 1" }), "(the code ran and printed nothing)");
      assert.equal(await repl.tool.invoke({ code: "z + 1" }), "result: 2");
    } finally {
      await repl.close();
    }
  });
}
