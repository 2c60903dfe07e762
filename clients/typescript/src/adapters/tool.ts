/**
 * What every adapter's tool does, whatever its framework: strip a Markdown fence from the
 * model's code, run it (in a fresh sandbox or the tool's session), hand the whole execution to
 * the program (`onExecution`) and the model its text ({@link render}). A failure of the code
 * is the tool's answer; a refusal by the server (a bad key, a rate limit, code too large) is
 * thrown, for the framework to handle as a tool's failure.
 */

import {
  type CallOptions,
  type ExecutionLike,
  Kernel,
  type OpensSessions,
  type RunsCode,
  type SessionLike,
  runOnce,
} from "./sandbox.js";
import {
  CODE_DESCRIPTION,
  DEFAULT_MAX_CHARS,
  type Image,
  type ImageBounds,
  ONE_SHOT_DESCRIPTION,
  SESSION_DESCRIPTION,
  pickImages,
  render,
  stripFences,
} from "./text.js";

export type { Image, ImageBounds } from "./text.js";

/** The settings a client's `run` (or `session`) takes, without the per-call `signal`. */
export type SettingsOf<F> = F extends (first: never, options?: infer O) => unknown
  ? Omit<NonNullable<O>, keyof CallOptions>
  : F extends (options?: infer O) => unknown
    ? NonNullable<O>
    : never;

/** The execution type a client's `run` answers. */
export type ExecutionOf<C> = C extends { run(...args: never[]): Promise<infer E> } ? E : ExecutionLike;

/** What every tool takes besides its client. */
export interface ToolOptions<E> {
  /** The tool's name, as the model sees it (`python`, or `python_repl` for a session). */
  name?: string;
  /** What the model is told of the tool. */
  description?: string;
  /** The most characters of text the model is given back (default 20 000). */
  maxChars?: number;
  /**
   * Called with each whole execution (charts, files, the decoded result), which the model
   * sees only as text: how the program gets what is kept out of the model's context.
   */
  onExecution?: (execution: E, code: string) => void;
  /**
   * Hand the execution's charts (its `image/png` display outputs) to the model as images
   * beside the text, for a multimodal model: `true` within the default bounds (4 images of
   * 1 MiB at most), or the bounds. Charts past them are named in the text, as without it.
   */
  images?: boolean | ImageBounds | undefined;
}

/** A tool that runs each call in a fresh sandbox. */
export interface PythonToolOptions<C extends RunsCode> extends ToolOptions<ExecutionOf<C>> {
  /** The client (an `Airlock`). */
  client: C;
  /** What each run takes besides the code: limits, files, env, environment, egress. */
  sandbox?: SettingsOf<C["run"]>;
}

/** A tool that keeps one session between calls. */
export interface PythonREPLOptions<C extends OpensSessions> extends ToolOptions<ExecutionLike> {
  /** The client (an `Airlock`), or a function that opens a session. */
  client: C | (() => Promise<SessionLike>);
  /** What the session is opened with: limits, files, env, idle timeout, lifetime, ... */
  sandbox?: C extends OpensSessions ? SettingsOf<C["session"]> : never;
}

/** What the model is given: the text, and the charts when the tool was asked for them. */
export interface TextAndImages {
  /** The execution as text ({@link render}). */
  readonly text: string;
  /** The charts handed over as images, in order (none unless asked). */
  readonly images: readonly Image[];
}

/** A tool's answer: what the model is given and the whole execution for the program. */
export interface Answer<E> extends TextAndImages {
  readonly execution: E;
}

/** What the AI SDK's `toModelOutput` answers (Mastra's too), as far as the tools use it. */
export type ModelOutput =
  | { type: "text"; value: string }
  | {
      type: "content";
      value: ({ type: "text"; text: string } | { type: "file"; mediaType: string; data: { type: "data"; data: string } })[];
    };

/** The text, then each image as a file part: the AI SDK's form of images in a tool result. */
export function modelOutput({ text, images }: TextAndImages): ModelOutput {
  if (images.length === 0) return { type: "text", value: text };
  const files = images.map(({ mediaType, data }) => ({ type: "file" as const, mediaType, data: { type: "data" as const, data } }));
  return { type: "content", value: [{ type: "text", text }, ...files] };
}

// The model's text and images of an execution, as the tool's options ask.
function answerOf<E>(execution: E, images: ToolOptions<E>["images"], maxChars: number, note?: string): Answer<E> {
  const e = execution as ExecutionLike;
  const picked = images ? pickImages(e, images === true ? {} : images) : { images: [], attached: undefined };
  return { text: render(e, { maxChars, note, attached: picked.attached }), images: picked.images, execution };
}

/** The framework-independent half of a tool. */
export interface Runner<E> {
  readonly name: string;
  readonly description: string;
  /** Runs the model's code and answers. */
  answer(code: string, signal?: AbortSignal): Promise<Answer<E>>;
}

/** The runner of a one-shot tool. */
export function oneShot<C extends RunsCode>(options: PythonToolOptions<C>): Runner<ExecutionOf<C>> {
  const { client, sandbox, maxChars = DEFAULT_MAX_CHARS, onExecution, images } = options;
  return {
    name: options.name ?? "python",
    description: options.description ?? ONE_SHOT_DESCRIPTION,
    async answer(code, signal) {
      const source = stripFences(code);
      const execution = (await runOnce(client, source, sandbox, signal)) as ExecutionOf<C>;
      onExecution?.(execution, source);
      return answerOf(execution, images, maxChars);
    },
  };
}

/** A session tool's runner and its kernel (its session's id, closing it). */
export interface REPLRunner extends Runner<ExecutionLike> {
  readonly kernel: Kernel<object>;
}

/** The runner of a session tool. */
export function repl<C extends OpensSessions>(options: PythonREPLOptions<C>): REPLRunner {
  const { client, sandbox, maxChars = DEFAULT_MAX_CHARS, onExecution, images } = options;
  const kernel = new Kernel<object>(client as OpensSessions | (() => Promise<SessionLike>), sandbox as object | undefined);
  return {
    name: options.name ?? "python_repl",
    description: options.description ?? SESSION_DESCRIPTION,
    kernel,
    async answer(code, signal) {
      const source = stripFences(code);
      const { execution, note } = await kernel.run(source, signal);
      onExecution?.(execution, source);
      return answerOf(execution, images, maxChars, note);
    },
  };
}

/** The tools' one argument. */
export interface CodeInput {
  /** The Python code to run. */
  code: string;
}

/**
 * The `code` of a tool's arguments. Where a framework types the arguments of a JSON schema as
 * unknown, they are checked here rather than trusted.
 */
export function codeOf(input: unknown): string {
  const code = typeof input === "object" && input !== null ? (input as { code?: unknown }).code : undefined;
  if (typeof code !== "string") throw new TypeError("the tool's argument `code` must be a string");
  return code;
}

/** The JSON schema of every tool's one argument (a fresh object: frameworks may annotate it). */
export function codeSchema(): {
  type: "object";
  properties: { code: { type: "string"; description: string } };
  required: ["code"];
  additionalProperties: false;
} {
  return {
    type: "object",
    properties: { code: { type: "string", description: CODE_DESCRIPTION } },
    required: ["code"],
    additionalProperties: false,
  };
}

/**
 * A session tool: `.tool` is the framework's tool, whose calls all run in one session opened
 * at the first (variables, imports and files persist, as in a notebook). `close()` destroys
 * the session's sandbox; an unclosed session ends at its idle timeout. If the session ends
 * (idle timeout, lifetime, `exit()`, a memory kill, a restart), the next call opens a new one
 * and tells the model its variables are gone. Calls run one at a time.
 */
export class PythonREPL<T> {
  /** The framework's tool. */
  readonly tool: T;
  readonly #kernel: Kernel<object>;

  /** Wraps `tool`, whose calls run in `kernel`. */
  constructor(tool: T, kernel: Kernel<object>) {
    this.tool = tool;
    this.#kernel = kernel;
  }

  /** The id of the open session (undefined before the first call and after close). */
  get sessionId(): string | undefined {
    return this.#kernel.sessionId;
  }

  /** Destroys the session's sandbox, after the calls already made. */
  close(): Promise<void> {
    return this.#kernel.close();
  }
}
