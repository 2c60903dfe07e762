/**
 * LangChain.js tools (`@langchain/core`) that run the model's Python in airlock:
 * {@link pythonTool}, a fresh sandbox for each call, and {@link pythonREPL}, whose `.tool`
 * keeps one session between calls (variables, imports and files persist): the safe
 * replacement of a Python REPL tool that runs the model's code in your process.
 *
 * ```ts
 * import { createAgent } from "langchain";
 * import { Airlock } from "airlock-client";
 * import { pythonREPL } from "airlock-client/adapters/langchain";
 *
 * const python = pythonREPL({ client: new Airlock() });
 * const agent = createAgent({ model: "openai:gpt-5", tools: [python.tool] });
 * await agent.invoke({ messages: [{ role: "user", content: "What is the 20th Fibonacci number?" }] });
 * await python.close();
 * ```
 *
 * Both are `DynamicStructuredTool`s with one argument, `code`, and `responseFormat`
 * `"content_and_artifact"`: the `ToolMessage`'s content is the text the model reads, its
 * `artifact` the whole execution (charts, files, the decoded result) for the program. With
 * `images`, a call that drew charts answers content blocks instead: the text, then each chart
 * as a standard `image` block (`mimeType`, base64 `data`), for a multimodal chat model. A
 * refusal by the server is thrown, as any tool's failure; the run's abort signal cancels the
 * request.
 */

import { DynamicStructuredTool } from "@langchain/core/tools";
import type { ExecutionLike, OpensSessions, RunsCode } from "./sandbox.js";
import {
  type CodeInput,
  type ExecutionOf,
  type PythonREPLOptions,
  type PythonToolOptions,
  PythonREPL,
  type Runner,
  codeSchema,
  oneShot,
  repl,
} from "./tool.js";

export { PythonREPL } from "./tool.js";
export type { Image, ImageBounds, PythonREPLOptions, PythonToolOptions } from "./tool.js";

/** A `ToolMessage`'s content: the text, or with charts the text and `image` blocks. */
export type AirlockContent =
  | string
  | ({ type: "text"; text: string } | { type: "image"; mimeType: string; data: string })[];

/** A LangChain tool whose artifact is an execution of type `E`. */
export type AirlockTool<E> = DynamicStructuredTool<ReturnType<typeof codeSchema>, CodeInput, CodeInput, [AirlockContent, E]>;

function langchainTool<E>(runner: Runner<E>): AirlockTool<E> {
  return new DynamicStructuredTool({
    name: runner.name,
    description: runner.description,
    schema: codeSchema(),
    responseFormat: "content_and_artifact",
    func: async ({ code }: CodeInput, _run?: unknown, config?: { signal?: AbortSignal }): Promise<[AirlockContent, E]> => {
      const { text, images, execution } = await runner.answer(code, config?.signal);
      if (images.length === 0) return [text, execution];
      const blocks = images.map(({ mediaType, data }) => ({ type: "image" as const, mimeType: mediaType, data }));
      return [[{ type: "text", text }, ...blocks], execution];
    },
  });
}

/** A tool (named `python`) that runs each call's code in a fresh sandbox. */
export function pythonTool<C extends RunsCode>(options: PythonToolOptions<C>): AirlockTool<ExecutionOf<C>> {
  return langchainTool(oneShot(options));
}

/**
 * A session tool: `.tool` (named `python_repl`) runs every call's code in one session, opened
 * at the first. `await repl.close()` destroys the session's sandbox.
 */
export function pythonREPL<C extends OpensSessions>(options: PythonREPLOptions<C>): PythonREPL<AirlockTool<ExecutionLike>> {
  const runner = repl(options);
  return new PythonREPL(langchainTool(runner), runner.kernel);
}
