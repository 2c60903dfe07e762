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
 * `artifact` the whole execution (charts, files, the decoded result) for the program. A
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
export type { PythonREPLOptions, PythonToolOptions } from "./tool.js";

/** A LangChain tool whose artifact is an execution of type `E`. */
export type AirlockTool<E> = DynamicStructuredTool<ReturnType<typeof codeSchema>, CodeInput, CodeInput, [string, E]>;

function langchainTool<E>(runner: Runner<E>): AirlockTool<E> {
  return new DynamicStructuredTool({
    name: runner.name,
    description: runner.description,
    schema: codeSchema(),
    responseFormat: "content_and_artifact",
    func: async ({ code }: CodeInput, _run?: unknown, config?: { signal?: AbortSignal }): Promise<[string, E]> => {
      const { text, execution } = await runner.answer(code, config?.signal);
      return [text, execution];
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
