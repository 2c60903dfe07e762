// `Airlock`: the client of one airlock server.

import { BackgroundExecution, submit } from "./background.js";
import { Environments } from "./environments.js";
import type { Value } from "./values.js";
import { segment, Transport, type CallOptions, type Fetch } from "./http.js";
import { object, toEvaluation, toExecution, valueOf } from "./results.js";
import { listSessions, openSession, sessionById, type Session, type SessionInfo, type SessionOptions } from "./sessions.js";
import { executeBody, type RunOptions, type StreamOptions } from "./request.js";
import { ExecutionStream } from "./stream.js";
import type {
  Approval,
  ApprovalDetail,
  Decided,
  Evaluation,
  Execution,
  ExecutionRecord,
  ToolList,
} from "./types.js";
import { Volumes } from "./volumes.js";

/** The server's URL when neither the options nor `AIRLOCK_URL` give one. */
export const DEFAULT_URL = "http://127.0.0.1:8080";

/** How a client reaches its server. */
export interface AirlockOptions {
  /** The server's URL; `AIRLOCK_URL` from the environment, else `http://127.0.0.1:8080`. */
  baseUrl?: string | undefined;
  /** The API key; `AIRLOCK_API_KEY` from the environment. */
  apiKey?: string | undefined;
  /** The `fetch` to use (an edge runtime's, a test's); the global one by default. */
  fetch?: Fetch | undefined;
  /** How many times a 429 or 503 refusal is sent again, as its `Retry-After` says; 2. */
  maxRetries?: number | undefined;
  /** The longest `Retry-After` waited for (ms); a longer one is thrown at once. 10 000. */
  maxRetryWaitMs?: number | undefined;
  /** Every call's timeout (ms) unless the call gives its own; none by default. */
  timeoutMs?: number | undefined;
  /** The most bytes an answer may take; 64 MiB. */
  maxResponseBytes?: number | undefined;
}


/** A client of one airlock server. Every method takes `signal` and `timeoutMs`; refusals
 * throw their `AirlockError` subclass (one per error code); a sandbox verdict (a timeout, a
 * memory kill) is an `Execution` with its `status`, not an error. */
export class Airlock {
  /** The transport every call goes through (for code that builds on the client). */
  readonly transport: Transport;

  constructor(options: AirlockOptions = {}) {
    const apiKey = options.apiKey ?? fromEnvironment("AIRLOCK_API_KEY");
    if (!apiKey) throw new TypeError("no API key: pass apiKey or set AIRLOCK_API_KEY");
    this.transport = new Transport({
      baseUrl: options.baseUrl ?? (fromEnvironment("AIRLOCK_URL") || DEFAULT_URL),
      apiKey,
      fetch: options.fetch,
      maxRetries: options.maxRetries,
      maxRetryWaitMs: options.maxRetryWaitMs,
      timeoutMs: options.timeoutMs,
      maxResponseBytes: options.maxResponseBytes,
    });
  }

  /** The server's URL. */
  get baseUrl(): string {
    return this.transport.baseUrl;
  }

  /** Runs `code` in a fresh sandbox and returns its `Execution` (whatever its status).
   * Aborting the call kills the sandbox. */
  async run(code: string, options: RunOptions = {}): Promise<Execution> {
    const answer = await this.transport.request(
      { method: "POST", path: "/v1/execute", json: executeBody(code, options) },
      "json",
      options,
    );
    return toExecution(answer.body, answer.requestId);
  }

  /** Function mode: runs `code` as a module, calls `entrypoint(**args)` and returns its
   * value, decoded; throws `ExecutionFailedError` (with the execution) unless it ended `ok`. */
  async call(
    code: string,
    entrypoint: string,
    args: Record<string, unknown> = {},
    options: Omit<RunOptions, "entrypoint" | "inputs"> = {},
  ): Promise<Value> {
    return valueOf(await this.run(code, { ...options, entrypoint, inputs: args }), entrypoint);
  }

  /** As `run`, with the output as it is written: `for await (const event of
   * airlock.stream(code))` gives `stdout`/`stderr` events, `truncated`, `approval` (and
   * `onApproval` is called), `display` outputs and the `result` last. */
  stream(code: string, options: StreamOptions = {}): ExecutionStream {
    const body = executeBody(code, options);
    return new ExecutionStream(
      () => this.transport.events({ method: "POST", path: "/v1/execute", json: body }, options),
      options.onApproval,
    );
  }

  /** Evaluates a Python literal expression natively on the server (`/v1/eval`: no sandbox,
   * no interpreter). An expression that raises is an `Evaluation` with `ok` false. */
  async eval(expression: string, options: CallOptions = {}): Promise<Evaluation> {
    const answer = await this.transport.request({ method: "POST", path: "/v1/eval", json: { expression } }, "json", options);
    return toEvaluation(answer.body);
  }

  /** The audit record of one of this key's executions (scope `read`). */
  async execution(id: string, options: CallOptions = {}): Promise<ExecutionRecord> {
    const answer = await this.transport.request(
      { method: "GET", path: `/v1/executions/${segment(id, "an execution id")}` },
      "json",
      options,
    );
    return object(answer.body, "$") as unknown as ExecutionRecord;
  }

  /** The operator's tools this key's code may call, with their Python signatures. */
  async tools(options: CallOptions = {}): Promise<ToolList> {
    const answer = await this.transport.request({ method: "GET", path: "/v1/tools" }, "json", options);
    return object(answer.body, "$") as unknown as ToolList;
  }

  /** Tool calls waiting for an approval that this key (scope `approve`) may decide: those
   * of the keys its `approves` names, never its own; oldest first. */
  async approvals(options: CallOptions = {}): Promise<Approval[]> {
    const answer = await this.transport.request({ method: "GET", path: "/v1/approvals" }, "json", options);
    const list = object(answer.body, "$")["approvals"];
    if (!Array.isArray(list)) throw object(list, "$.approvals");
    return list as Approval[];
  }

  /** One waiting call as listed, with its arguments whole (show a person
   * `approval.arguments_preview`, not those). `NotFoundError` as for `approve`. */
  async approval(id: string, options: CallOptions = {}): Promise<ApprovalDetail> {
    const answer = await this.transport.request({ method: "GET", path: approvalPath(id) }, "json", options);
    return object(answer.body, "$") as unknown as ApprovalDetail;
  }

  /** Lets the one waiting call `id` run. `NotFoundError` when it waits no more (decided,
   * timed out, withdrawn) or is not this key's to decide. */
  approve(id: string, reason?: string, options: CallOptions = {}): Promise<Decided> {
    return this.#decide(id, "approve", reason, options);
  }

  /** Fails the one waiting call `id`: the code gets `ToolError(kind="denied")` with `reason`. */
  deny(id: string, reason?: string, options: CallOptions = {}): Promise<Decided> {
    return this.#decide(id, "deny", reason, options);
  }

  /** `/readyz`: `ready`, and `reasons` when not (a 503 is its answer, not an error). */
  async ready(options: CallOptions = {}): Promise<{ ready: boolean; reasons?: string[]; [more: string]: unknown }> {
    const answer = await this.transport.request({ method: "GET", path: "/readyz", ok: [200, 503] }, "json", options);
    const body = object(answer.body, "$");
    if (typeof body["ready"] !== "boolean") throw object(null, "$.ready");
    return body as { ready: boolean };
  }

  /** The server's scan report of a pickle (or a ZIP of pickles); it is never loaded. */
  async scanPickle(data: Uint8Array, options: CallOptions = {}): Promise<Record<string, unknown>> {
    const answer = await this.transport.request({ method: "POST", path: "/v1/pickle/scan", body: data }, "json", options);
    return object(answer.body, "$");
  }

  // Sessions, background executions, volumes and environments: their own modules.

  /** Opens a session: one sandbox and interpreter for many cells (variables, imports and
   * files persist). `close()` it when done. */
  session(options: SessionOptions = {}): Promise<Session> {
    return openSession(this.transport, options);
  }

  /** This key's session `id`, open or paused (a paused one is kept across restarts);
   * `NotFoundError` when there is none. */
  sessionById(id: string, options: CallOptions = {}): Promise<Session> {
    return sessionById(this.transport, id, options);
  }

  /** This key's sessions, open and paused. */
  sessions(options: CallOptions = {}): Promise<SessionInfo[]> {
    return listSessions(this.transport, options);
  }

  /** As `run`, in the background: answered at once with a handle, and it runs on the server
   * whether or not anyone follows it (`limits.timeout_ms` up to the background ceiling, 4 h
   * by default). Refusals throw here, as `run`'s do. */
  submit(code: string, options: RunOptions = {}): Promise<BackgroundExecution> {
    return submit(this.transport, code, options);
  }

  /** A handle on this key's background execution `id`; nothing is asked until it is used. */
  background(id: string): BackgroundExecution {
    return new BackgroundExecution(this.transport, id);
  }

  /** This key's volumes. */
  get volumes(): Volumes {
    return (this.#volumes ??= new Volumes(this.transport));
  }

  /** The named environments. */
  get environments(): Environments {
    return (this.#environments ??= new Environments(this.transport));
  }

  #volumes: Volumes | undefined;
  #environments: Environments | undefined;

  async #decide(id: string, decision: "approve" | "deny", reason: string | undefined, options: CallOptions): Promise<Decided> {
    const json: { decision: string; reason?: string } = { decision };
    if (reason !== undefined) json.reason = reason;
    const answer = await this.transport.request({ method: "POST", path: approvalPath(id), json }, "json", options);
    return object(answer.body, "$") as unknown as Decided;
  }
}

function approvalPath(id: string): string {
  return `/v1/approvals/${segment(id, "an approval id")}`;
}

/** A variable of the runtime's environment, where it has one (Node and Bun's `process.env`,
 * Deno's `Deno.env`, which may be denied); undefined elsewhere (browsers, edge runtimes). */
export function fromEnvironment(name: string): string | undefined {
  const g = globalThis as {
    process?: { env?: Record<string, string | undefined> };
    Deno?: { env?: { get(name: string): string | undefined } };
  };
  try {
    const deno = g.Deno?.env?.get(name);
    if (typeof deno === "string") return deno;
  } catch {
    // Deno without --allow-env: no environment.
  }
  try {
    const value = g.process?.env?.[name];
    if (typeof value === "string") return value;
  } catch {
    // A runtime whose process.env throws.
  }
  return undefined;
}
