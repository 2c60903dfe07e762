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
 * named in that text, not inlined; `onExecution` hands the program each whole execution. With
 * `images`, the tool's output is `{ text, images }` and its `toModelOutput` gives the model the
 * text and each chart as an `image/png` file part, for a multimodal model. A
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
  type TextAndImages,
  type ToolOptions,
  codeSchema,
  modelOutput,
  oneShot,
  repl,
} from "./tool.js";

export { PythonREPL } from "./tool.js";
export type { Image, ImageBounds, PythonREPLOptions, PythonToolOptions, TextAndImages } from "./tool.js";

/** What the tool's `execute` answers: text, or text and charts when asked for `images`. */
export type AirlockToolOutput<I> = I extends false | undefined ? string : TextAndImages;

/** The tools' type: an SDK tool taking `code`. */
export type AirlockTool<I> = Tool<CodeInput, AirlockToolOutput<I>>;

type Images = ToolOptions<unknown>["images"];

function aiTool<E, I extends Images>(runner: Runner<E>, images: I): AirlockTool<I> {
  if (!images) {
    const textTool: Tool<CodeInput, string> = tool({
      description: runner.description,
      inputSchema: jsonSchema<CodeInput>(codeSchema()),
      execute: async ({ code }, { abortSignal }) => (await runner.answer(code, abortSignal)).text,
    });
    return textTool as AirlockTool<I>;
  }
  const imageTool: Tool<CodeInput, TextAndImages> = tool({
    description: runner.description,
    inputSchema: jsonSchema<CodeInput>(codeSchema()),
    execute: async ({ code }, { abortSignal }) => {
      const { text, images } = await runner.answer(code, abortSignal);
      return { text, images };
    },
    toModelOutput: ({ output }) => modelOutput(output),
  });
  return imageTool as AirlockTool<I>;
}

/**
 * A tool that runs each call's code in a fresh sandbox. Give it to the SDK under the name the
 * model should see (`tools: { python: pythonTool(...) }`); `name` is not used here.
 */
export function pythonTool<C extends RunsCode, I extends Images = undefined>(
  options: PythonToolOptions<C> & { images?: I },
): AirlockTool<I> {
  return aiTool(oneShot(options), options.images as I);
}

/**
 * A session tool: `.tool` runs every call's code in one session, opened at the first.
 * `await repl.close()` destroys the session's sandbox.
 */
export function pythonREPL<C extends OpensSessions, I extends Images = undefined>(
  options: PythonREPLOptions<C> & { images?: I },
): PythonREPL<AirlockTool<I>> {
  const runner = repl(options);
  return new PythonREPL(aiTool(runner, options.images as I), runner.kernel);
}
