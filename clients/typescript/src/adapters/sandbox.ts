/**
 * Where an adapter's code runs, shared by the adapters: a fresh sandbox for each call
 * ({@link runOnce}), or one session kept between calls like a REPL ({@link Kernel}).
 *
 * The adapters ask only for the little they use, as structural types: `Airlock` and its
 * sessions fit them, and so does anything else with the same shape.
 *
 * A session can end under a tool: its idle timeout or lifetime passes, a restart loses it, or
 * a cell ends the interpreter (`exit()`, a memory kill). The next call then opens a new
 * session and says so in its note; it never runs a cell twice (a refused cell did not run).
 */

/**
 * What an adapter reads of an execution (an `Execution` of the client fits): the API's fields
 * under the API's names, and `resultJson`, the result as the server sent it.
 */
export interface ExecutionLike {
  /** `ok`, `error`, `timeout`, `memory_limit`, `cpu_limit`, `policy_violation`, `crashed`, ... */
  readonly status: string;
  readonly stdout: string;
  readonly stderr: string;
  readonly stdout_truncated?: boolean | undefined;
  readonly stderr_truncated?: boolean | undefined;
  /** The last expression's value as the server sent it (typed forms undecoded); null if none. */
  readonly resultJson?: unknown;
  /** The program's uncaught exception, or airlock's own failure. */
  readonly error?: { readonly type: string; readonly message: string; readonly traceback?: string | null | undefined } | null | undefined;
  /** Display outputs (charts, HTML): only their types are told to the model, unless asked. */
  readonly outputs?: readonly { readonly type: string; readonly data?: unknown }[] | undefined;
  /** Files the code left in `./outputs`: only their paths are told to the model. */
  readonly files?: readonly { readonly path: string }[] | undefined;
  /** Set on a session's cell that ended the session's interpreter. */
  readonly session_ended?: boolean | null | undefined;
  readonly limits?: {
    readonly timeout_ms?: number | undefined;
    readonly cpu_ms?: number | undefined;
    readonly memory_mb?: number | undefined;
  } | undefined;
  readonly limits_hit?: readonly string[] | undefined;
  readonly signal?: number | null | undefined;
  readonly exit_code?: number | null | undefined;
}

/** The options an adapter passes with each run: the framework's abort signal. */
export interface CallOptions {
  /** Aborts the request (and the execution, where the API allows) when the agent is stopped. */
  signal?: AbortSignal | undefined;
}

/** A client that runs code in a fresh sandbox (`Airlock` fits). */
export interface RunsCode<Settings extends object = object> {
  /** Runs `code` in a fresh sandbox with `settings`. */
  run(code: string, options?: Settings & CallOptions): Promise<ExecutionLike>;
}

/** A session: one sandbox whose interpreter keeps its state between cells. */
export interface SessionLike {
  /** The session's id. */
  readonly id: string;
  /** Runs a cell in the session. */
  run(code: string, options?: CallOptions): Promise<ExecutionLike>;
  /** Destroys the session's sandbox. */
  close(): Promise<unknown>;
}

/** A client that opens sessions (`Airlock` fits). */
export interface OpensSessions<Settings extends object = object> {
  /** Opens a session with `settings`. */
  session(options?: Settings): Promise<SessionLike>;
}

/** Where a session tool's sessions come from: a client, or a function that opens one. */
export type SessionSource<Settings extends object = object> = OpensSessions<Settings> | (() => Promise<SessionLike>);

/** The note of a call that ran in a new session replacing an ended one. */
export const RESTARTED =
  "the previous session had ended (idle timeout, lifetime or exit): this code ran " +
  "in a fresh interpreter, without the earlier variables and files";

/** `code` in a fresh sandbox of `client`, with `settings` and the call's abort signal. */
export function runOnce<Settings extends object>(
  client: RunsCode<Settings>,
  code: string,
  settings: Settings | undefined,
  signal: AbortSignal | undefined,
): Promise<ExecutionLike> {
  return client.run(code, { ...(settings ?? ({} as Settings)), ...(signal ? { signal } : {}) });
}

/** A cell's execution, and a note when it ran in a new session replacing an ended one. */
export interface Cell {
  readonly execution: ExecutionLike;
  readonly note: string | undefined;
}

/**
 * One session kept between calls, opened at the first. Calls run one at a time, in the order
 * they came (a session runs one cell at a time: a second would be refused as busy).
 */
export class Kernel<Settings extends object = object> {
  #source: SessionSource<Settings>;
  #settings: Settings | undefined;
  #session: SessionLike | undefined;
  #queue: Promise<unknown> = Promise.resolve();
  #lost = false; // a cell ended the last session: say so when the next one opens
  #closed = false;

  /** A kernel whose sessions come from `source`, opened with `settings`. */
  constructor(source: SessionSource<Settings>, settings?: Settings) {
    this.#source = source;
    this.#settings = settings;
  }

  /** The open session's id, if any. */
  get sessionId(): string | undefined {
    return this.#session?.id;
  }

  /** Whether {@link close} was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Runs a cell, after the calls before it. */
  run(code: string, signal?: AbortSignal): Promise<Cell> {
    return this.#serial(async () => {
      if (this.#closed) throw new Error("this tool's session was closed");
      let note = this.#lost ? RESTARTED : undefined;
      const fresh = this.#session === undefined;
      let session = await this.#open();
      const options = signal ? { signal } : {};
      let execution: ExecutionLike;
      try {
        execution = await session.run(code, options);
      } catch (error) {
        if (fresh || !sessionGone(error)) throw error;
        // Gone while unused (expired, lost in a restart): the cell did not run, so it runs
        // in a new session.
        await this.#drop();
        session = await this.#open();
        execution = await session.run(code, options);
        note = RESTARTED;
      }
      this.#lost = Boolean(execution.session_ended);
      if (this.#lost) await this.#drop();
      return { execution, note };
    });
  }

  /** Closes the session (destroying its sandbox), after the calls already made. */
  close(): Promise<void> {
    this.#closed = true;
    return this.#serial(() => this.#drop());
  }

  #serial<T>(work: () => Promise<T>): Promise<T> {
    const next = this.#queue.then(work, work);
    this.#queue = next.catch(() => undefined);
    return next;
  }

  async #open(): Promise<SessionLike> {
    if (this.#session === undefined) {
      const source = this.#source;
      this.#session = await (typeof source === "function" ? source() : source.session(this.#settings));
    }
    return this.#session;
  }

  async #drop(): Promise<void> {
    const session = this.#session;
    this.#session = undefined;
    if (session !== undefined) {
      try {
        await session.close();
      } catch {
        // Gone already; the server reaps what it cannot close.
      }
    }
  }
}

/**
 * Whether an error says the session is no longer there: 404 (expired and reaped), 409
 * `session_ended`, 410 `session_lost` (a restart). Read by structure, from the error's
 * `status` and `code`.
 */
export function sessionGone(error: unknown): boolean {
  if (typeof error !== "object" || error === null) return false;
  const { status, code } = error as { status?: unknown; code?: unknown };
  return status === 404 || status === 410 || code === "session_ended" || code === "session_lost";
}
