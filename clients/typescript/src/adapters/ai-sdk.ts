/**
 * Tools for the Vercel AI SDK (`ai`) that run the model's Python in airlock:
 * {@link pythonTool}, a fresh sandbox for each call, and {@link pythonREPL}, whose `.tool`
 * keeps one session between calls (variables, imports and files persist).
 *
 * ```ts
 * import { generateText, isStepCount } from "ai";
 * import { Airlock } from "airlock-client";
 * import { pythonTool } from "airlock-client/adapters/ai-sdk";
 *
 * const airlock = new Airlock();
 * const { text } = await generateText({
 *   model,
 *   tools: { python: pythonTool({ client: airlock }) },
 *   stopWhen: isStepCount(5),
 *   prompt: "What is the 20th Fibonacci number?",
 * });
 * ```
 *
 * Each tool takes one argument, `code`, and answers text: what the code printed, the value of
 * its last expression, the traceback of its error, why it was stopped. Charts and files are
 * named in that text, never inlined; `onExecution` hands the program each whole execution. A
 * refusal by the server is thrown from `execute`, which the SDK turns into a tool error the
 * model reads. The SDK's abort signal cancels the request.
 */

import { type Tool, jsonSchema, tool } from "ai";
import type { OpensSessions, RunsCode } from "./sandbox.js";
import {
  type CodeInput,
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

function aiTool<E>(runner: Runner<E>): Tool<CodeInput, string> {
  return tool({
    description: runner.description,
    inputSchema: jsonSchema<CodeInput>(codeSchema()),
    execute: async ({ code }, { abortSignal }) => (await runner.answer(code, abortSignal)).text,
  });
}

/**
 * A tool that runs each call's code in a fresh sandbox. Give it to the SDK under the name the
 * model should see (`tools: { python: pythonTool(...) }`); `name` is not used here.
 */
export function pythonTool<C extends RunsCode>(options: PythonToolOptions<C>): Tool<CodeInput, string> {
  return aiTool(oneShot(options));
}

/**
 * A session tool: `.tool` runs every call's code in one session, opened at the first.
 * `await repl.close()` destroys the session's sandbox.
 */
export function pythonREPL<C extends OpensSessions>(options: PythonREPLOptions<C>): PythonREPL<Tool<CodeInput, string>> {
  const runner = repl(options);
  return new PythonREPL(aiTool(runner), runner.kernel);
}
