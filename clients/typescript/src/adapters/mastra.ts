/**
 * Mastra tools (`@mastra/core`, made with `createTool`) that run the model's Python in
 * airlock: {@link pythonTool}, a fresh sandbox for each call, and {@link pythonREPL}, whose
 * `.tool` keeps one session between calls (variables, imports and files persist).
 *
 * ```ts
 * import { Agent } from "@mastra/core/agent";
 * import { Airlock } from "airlock-client";
 * import { pythonTool } from "airlock-client/adapters/mastra";
 *
 * const agent = new Agent({
 *   id: "analyst",
 *   name: "analyst",
 *   instructions: "Use Python for arithmetic.",
 *   model,
 *   tools: { python: pythonTool({ client: new Airlock() }) },
 * });
 * const { text } = await agent.generate("What is the 20th Fibonacci number?");
 * ```
 *
 * Each tool's id is its name (`python`, `python_repl`); it takes one argument, `code`, and
 * answers text. A refusal by the server is thrown, which Mastra hands the model as the tool's
 * error. The agent's abort signal cancels the request.
 */

import { createTool } from "@mastra/core/tools";
import type { OpensSessions, RunsCode } from "./sandbox.js";
import {
  type PythonREPLOptions,
  type PythonToolOptions,
  PythonREPL,
  type Runner,
  codeOf,
  codeSchema,
  oneShot,
  repl,
} from "./tool.js";

export { PythonREPL } from "./tool.js";
export type { PythonREPLOptions, PythonToolOptions } from "./tool.js";

function mastraTool<E>(runner: Runner<E>) {
  return createTool({
    id: runner.name,
    description: runner.description,
    inputSchema: codeSchema(),
    execute: async (input, context) => (await runner.answer(codeOf(input), context?.abortSignal)).text,
  });
}

/** The tools' type: a Mastra tool taking `code` and answering text. */
export type AirlockMastraTool = ReturnType<typeof mastraTool>;

/** A tool (id `python`) that runs each call's code in a fresh sandbox. */
export function pythonTool<C extends RunsCode>(options: PythonToolOptions<C>): AirlockMastraTool {
  return mastraTool(oneShot(options));
}

/**
 * A session tool: `.tool` (id `python_repl`) runs every call's code in one session, opened at
 * the first. `await repl.close()` destroys the session's sandbox.
 */
export function pythonREPL<C extends OpensSessions>(options: PythonREPLOptions<C>): PythonREPL<AirlockMastraTool> {
  const runner = repl(options);
  return new PythonREPL(mastraTool(runner), runner.kernel);
}
