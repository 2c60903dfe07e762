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
 * error. The agent's abort signal cancels the request. With `images`, the tool's output is
 * `{ text, images }` and its `toModelOutput` gives the model the text and each chart as an
 * `image/png` file part (the AI SDK's form, which Mastra passes to the model).
 */

import { createTool } from "@mastra/core/tools";
import type { OpensSessions, RunsCode } from "./sandbox.js";
import {
  type PythonREPLOptions,
  type PythonToolOptions,
  PythonREPL,
  type Runner,
  type TextAndImages,
  type ToolOptions,
  codeOf,
  codeSchema,
  modelOutput,
  oneShot,
  repl,
} from "./tool.js";

export { PythonREPL } from "./tool.js";
export type { Image, ImageBounds, PythonREPLOptions, PythonToolOptions, TextAndImages } from "./tool.js";

function mastraTool<E>(runner: Runner<E>, images: ToolOptions<E>["images"]) {
  if (!images) {
    return createTool({
      id: runner.name,
      description: runner.description,
      inputSchema: codeSchema(),
      execute: async (input, context) => (await runner.answer(codeOf(input), context?.abortSignal)).text,
    });
  }
  return createTool({
    id: runner.name,
    description: runner.description,
    inputSchema: codeSchema(),
    execute: async (input, context): Promise<TextAndImages> => {
      const { text, images } = await runner.answer(codeOf(input), context?.abortSignal);
      return { text, images };
    },
    toModelOutput: (output) => modelOutput(output as TextAndImages),
  });
}

/** The tools' type: a Mastra tool taking `code` and answering text. */
export type AirlockMastraTool = ReturnType<typeof mastraTool>;

/** A tool (id `python`) that runs each call's code in a fresh sandbox. */
export function pythonTool<C extends RunsCode>(options: PythonToolOptions<C>): AirlockMastraTool {
  return mastraTool(oneShot(options), options.images);
}

/**
 * A session tool: `.tool` (id `python_repl`) runs every call's code in one session, opened at
 * the first. `await repl.close()` destroys the session's sandbox.
 */
export function pythonREPL<C extends OpensSessions>(options: PythonREPLOptions<C>): PythonREPL<AirlockMastraTool> {
  const runner = repl(options);
  return new PythonREPL(mastraTool(runner, options.images), runner.kernel);
}
