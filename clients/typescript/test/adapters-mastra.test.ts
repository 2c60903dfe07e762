// The Mastra adapter against a real `airlock serve`, driven by a Mastra `Agent`'s own loop
// (`agent.generate`) with the AI SDK's mock model (`ai/test`, which Mastra accepts as a model):
// the model's code runs in the sandbox and its next turn reads the tool's text.

import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Agent } from "@mastra/core/agent";
import { MockLanguageModelV4, convertArrayToReadableStream } from "ai/test";
import { pythonREPL, pythonTool } from "../src/adapters/mastra.js";
import { Airlock } from "../src/index.js";
import { assertContained, assertSandboxed, hostile, probe } from "./adapters-common.js";
import { NODE_22, delegate } from "./adapters-node22.js";
import { KEY, type Server, launch } from "./harness.js";

type Prompt = { role: string; content: unknown }[];

/** The tool results the model was shown, in order, as text. */
function toolResults(prompt: Prompt): string[] {
  return prompt
    .filter((m) => m.role === "tool")
    .flatMap((m) => m.content as { type: string; output: { type: string; value: unknown } }[])
    .filter((p) => p.type === "tool-result")
    .map((p) => (typeof p.output.value === "string" ? p.output.value : JSON.stringify(p.output.value)));
}

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};

/** A model that calls `tool` with each of `codes` in turn, then answers with every result it
 * was shown, joined by `---` lines. Mastra's generate() calls doGenerate, its stream()
 * doStream: both answer. */
function scripted(tool: string, codes: string[]): MockLanguageModelV4 {
  return new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      const done = toolResults(prompt as Prompt);
      const code = codes[done.length];
      if (code !== undefined) {
        return {
          content: [{ type: "tool-call", toolCallId: `c${done.length}`, toolName: tool, input: JSON.stringify({ code }) }],
          finishReason: { unified: "tool-calls", raw: undefined },
          usage,
          warnings: [],
        };
      }
      return { content: [{ type: "text", text: done.join("\n---\n") }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
    },
    doStream: async ({ prompt }) => {
      const done = toolResults(prompt as Prompt);
      const code = codes[done.length];
      const parts =
        code !== undefined
          ? [
              { type: "tool-call", toolCallId: `c${done.length}`, toolName: tool, input: JSON.stringify({ code }) },
              { type: "finish", finishReason: { unified: "tool-calls", raw: undefined }, usage },
            ]
          : [
              { type: "text-start", id: "t" },
              { type: "text-delta", id: "t", delta: done.join("\n---\n") },
              { type: "text-end", id: "t" },
              { type: "finish", finishReason: { unified: "stop", raw: undefined }, usage },
            ];
      return { stream: convertArrayToReadableStream([{ type: "stream-start", warnings: [] }, ...parts] as never[]) };
    },
  });
}

if (!NODE_22) {
  delegate(import.meta.url);
} else {
  let server: Server;
  let airlock: Airlock;
  before(async () => {
    server = await launch();
    airlock = new Airlock({ baseUrl: server.url, apiKey: KEY });
  });
  after(async () => {
    await server?.stop();
  });

  test("mastra: an Agent runs the one-shot tool; the model reads each result", async () => {
    const marker = join(mkdtempSync(join(tmpdir(), "airlock-adapters-")), "pwned");
    const model = scripted("python", ["y = 6 * 7\nprint('set')\ny", "y", probe(server.url), hostile(marker)]);
    const agent = new Agent({
      id: "analyst",
      name: "analyst",
      instructions: "Use Python.",
      model: model as never, // ai@7's own copy of @ai-sdk/provider types; Mastra's differs by a patch
      tools: { python: pythonTool({ client: airlock }) },
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

  test("mastra: the session tool keeps state between calls", async (t) => {
    if (typeof (airlock as unknown as { session?: unknown }).session !== "function") {
      t.skip("the client has no sessions yet");
      return;
    }
    const repl = pythonREPL({ client: airlock as never });
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
