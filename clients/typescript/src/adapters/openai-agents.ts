/**
 * Function tools for the OpenAI Agents SDK for JS (`@openai/agents`) that run the model's
 * Python in airlock: {@link pythonTool}, a fresh sandbox for each call, and
 * {@link pythonREPL}, whose `.tool` keeps one session between calls (variables, imports and
 * files persist).
 *
 * ```ts
 * import { Agent, run } from "@openai/agents";
 * import { Airlock } from "airlock-client";
 * import { pythonREPL } from "airlock-client/adapters/openai-agents";
 *
 * const python = pythonREPL({ client: new Airlock() });
 * const agent = new Agent({ name: "analyst", instructions: "Use Python for arithmetic.", tools: [python.tool] });
 * const result = await run(agent, "What is the 20th Fibonacci number?");
 * await python.close();
 * ```
 *
 * Both are `FunctionTool`s made with the SDK's `tool()`, taking one argument, `code`, and
 * answering text. A refusal by the server is thrown from the tool, and the SDK handles it as
 * any tool's failure: by its `errorFunction` (which you may pass; by default the model is told
 * that the tool failed, without details; `null` makes the run fail). `needsApproval` and
 * `timeoutMs` pass through too. The run's abort signal cancels the request. With `images`, a
 * call that drew charts answers the SDK's structured output instead: a `text` item, then each
 * chart as an `image` item (which the SDK sends as `input_image`), for a multimodal model.
 */

import { type FunctionTool, tool } from "@openai/agents";
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
export type { Image, ImageBounds } from "./tool.js";

/** A function tool's output: the text, or with charts a `text` item and `image` items. */
export type AirlockToolOutput =
  | string
  | ({ type: "text"; text: string } | { type: "image"; image: { data: string; mediaType: string } })[];

/** What the SDK's `tool()` takes that these tools pass through. */
export interface AgentsToolOptions {
  /** What the model is told when the tool throws (a refusal by the server); `null` rethrows. */
  errorFunction?: ((context: unknown, error: unknown) => string | Promise<string>) | null;
  /** Whether a call waits for a human's approval (an interruption of the run). */
  needsApproval?: boolean;
  /** A bound on each call, in milliseconds, enforced by the SDK. */
  timeoutMs?: number;
}

/** The tools' type: a `FunctionTool` whose parameters are the one `code` argument. */
export type AirlockFunctionTool = FunctionTool<unknown, ReturnType<typeof codeSchema>, unknown>;

function agentsTool<E>(runner: Runner<E>, extra: AgentsToolOptions): AirlockFunctionTool {
  const { errorFunction, needsApproval, timeoutMs } = extra;
  return tool({
    name: runner.name,
    description: runner.description,
    parameters: codeSchema(),
    strict: true,
    ...(errorFunction !== undefined ? { errorFunction } : {}),
    ...(needsApproval !== undefined ? { needsApproval } : {}),
    ...(timeoutMs !== undefined ? { timeoutMs } : {}),
    execute: async (input, _context, details): Promise<AirlockToolOutput> => {
      const { text, images } = await runner.answer(codeOf(input), details?.signal);
      if (images.length === 0) return text;
      return [{ type: "text", text }, ...images.map(({ mediaType, data }) => ({ type: "image" as const, image: { data, mediaType } }))];
    },
  });
}

/** A tool (named `python`) that runs each call's code in a fresh sandbox. */
export function pythonTool<C extends RunsCode>(options: PythonToolOptions<C> & AgentsToolOptions): AirlockFunctionTool {
  return agentsTool(oneShot(options), options);
}

/**
 * A session tool: `.tool` (named `python_repl`) runs every call's code in one session, opened
 * at the first. `await repl.close()` destroys the session's sandbox.
 */
export function pythonREPL<C extends OpensSessions>(
  options: PythonREPLOptions<C> & AgentsToolOptions,
): PythonREPL<AirlockFunctionTool> {
  const runner = repl(options);
  return new PythonREPL(agentsTool(runner, options), runner.kernel);
}
