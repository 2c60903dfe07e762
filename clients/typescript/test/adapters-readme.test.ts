// The README's adapter examples (blocks marked `ts run-adapter`), as a user would read them:
// each is a module exporting `answer(model)`. Type-checked under strict against the built
// package (`airlock-client` resolves to this package by its own name), then imported and
// called with the framework's scripted model against a real server: the model's code runs in
// the sandbox and its next turn reads the tool's text (or, with `images`, the chart).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { before, test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { setTracingDisabled } from "@openai/agents";
import ts from "typescript";
import { assertPng, assertSandboxed, charts, probe, serve } from "./adapters-common.js";
import { ScriptedChatModel, ScriptedModel, call, scripted, toolResults } from "./adapters-mock-model.js";
import { NODE_22, delegate } from "./adapters-node22.js";
import { KEY } from "./harness.js";
import { built, strictProblems } from "./readme-check.js";

setTracingDisabled(true); // no trace export (it would need the network and an OpenAI key)

const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));
const WORK = join(PACKAGE, "build", "readme-adapters");
const README = readFileSync(join(PACKAGE, "README.md"), "utf8");
const BLOCKS = [...README.matchAll(/^```ts run-adapter\n([\s\S]*?)^```$/gm)].map((m) => m[1] ?? "");
const FIBONACCI = "a, b = 0, 1\nfor _ in range(20):\n    a, b = b, a + b\nprint(a)";

/** The adapter a block imports. */
function adapterOf(code: string): string {
  const match = /from "airlock-client\/adapters\/([a-z-]+)"/.exec(code);
  assert.ok(match?.[1], `no adapter import in:\n${code}`);
  return match[1];
}

type Answer = (model: unknown) => Promise<string>;

if (!NODE_22) {
  delegate(import.meta.url);
} else {
  const served = serve();

  before(() => {
    built();
    rmSync(WORK, { recursive: true, force: true });
    mkdirSync(WORK, { recursive: true });
    BLOCKS.forEach((code, i) => writeFileSync(join(WORK, `block${i}.mts`), code));
  });

  /** Imports block `i`, transpiled, and its `answer`, with the client's environment set. */
  async function load(i: number): Promise<Answer> {
    const js = ts.transpileModule(BLOCKS[i] ?? "", {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
    }).outputText;
    const file = join(WORK, `block${i}.mjs`);
    writeFileSync(file, js);
    process.env["AIRLOCK_URL"] = served.server.url;
    process.env["AIRLOCK_API_KEY"] = KEY;
    const module = (await import(pathToFileURL(file).href)) as { answer?: unknown };
    assert.equal(typeof module.answer, "function", "the example exports answer(model)");
    return module.answer as Answer;
  }

  test("the README has an adapter example for each framework, and one with images", () => {
    assert.deepEqual([...new Set(BLOCKS.map(adapterOf))].sort(), ["ai-sdk", "langchain", "mastra", "openai-agents"]);
    assert.ok(BLOCKS.some((b) => b.includes("images:")));
  });

  test("the README's adapter examples type-check under strict", () => {
    const problems = strictProblems(BLOCKS.map((_, i) => join(WORK, `block${i}.mts`)), WORK);
    assert.deepEqual(problems, []);
  });

  for (const [i, code] of BLOCKS.entries()) {
    const adapter = adapterOf(code);
    const images = code.includes("images:");
    test(`README adapter example ${i + 1} runs (${adapter}${images ? ", images" : ""})`, async () => {
      const answer = await load(i);
      if (images) {
        // The model draws a chart; its next turn gets the chart itself.
        assert.equal(adapter, "ai-sdk", "the test drives the images example with the AI SDK's model");
        const model = scripted("python", [charts(1)]);
        await answer(model);
        const [shown] = toolResults(model.doGenerateCalls[1]?.prompt);
        const parts = shown?.output.value as { type: string; mediaType?: string; data?: { data?: unknown } }[];
        assert.deepEqual(parts.map((p) => p.type), ["text", "file"]);
        assert.equal((parts[0] as { text?: string }).text, "stdout:\ndrawn\n[1 chart(s) attached as image(s)]");
        assert.equal(parts[1]?.mediaType, "image/png");
        assertPng(parts[1]?.data?.data);
        return;
      }
      // The model computes the answer, then probes where its code runs; its last turn answers
      // with every tool result it was shown.
      const codes = [FIBONACCI, probe(served.server.url)];
      let text: string;
      if (adapter === "langchain") {
        text = await answer(new ScriptedChatModel(codes.map((code, n) => call("python", code, n))));
      } else if (adapter === "openai-agents") {
        text = await answer(new ScriptedModel("python", codes));
      } else {
        text = await answer(scripted("python", codes));
      }
      const [first, second] = text.split("\n---\n");
      assert.equal(first, "stdout:\n6765");
      assertSandboxed(second ?? "");
    });
  }
}
