// Sessions: one sandbox and one interpreter kept for many cells (docs/sessions.md), their
// files, and pausing, resuming and forking them.

import { executeBody, type RunOptions } from "./request.js";
import { NotFoundError, SessionLostError } from "./errors.js";
import { FileHolder, array, expected } from "./files.js";
import { segment, type CallOptions, type Transport } from "./http.js";
import { object, toExecution, valueOf } from "./results.js";
import { ExecutionStream, type OnApproval } from "./stream.js";
import type { components } from "./openapi.gen.js";
import type { Execution } from "./types.js";
import type { Value } from "./values.js";

type Schemas = components["schemas"];

/** A session as the server holds it: cells run, when it expires, whether a cell ended it,
 * and `paused` (what its snapshot holds) or `resumed` (what came back). */
export type SessionInfo = Schemas["SessionInfo"];
/** What a paused session's snapshot holds, and what it could not keep (`not_kept`, per
 * variable with why). */
export type SnapshotInfo = Schemas["SnapshotInfo"];
/** One entry below a session's working directory: `file`, `dir`, `link` (never followed) or
 * `other`. */
export type FileEntry = Schemas["FileEntry"];

/** What a session is opened with: the options of `run` that describe a sandbox, and how long
 * it may live. Its `limits` cover the whole session (memory, pids, disk, CPU time), but
 * `timeout_ms` and `output_bytes`, which apply to each cell. */
export interface SessionOptions
  extends Pick<RunOptions, "limits" | "files" | "env" | "environment" | "egress" | "credentials" | "volumes" | "signal" | "timeoutMs"> {
  /** Closed by the server after this long without a request (at least 1000 ms). */
  idle_timeout_ms?: number | undefined;
  /** Closed by the server this long after it started (at least 1000 ms). */
  max_lifetime_ms?: number | undefined;
}

/** What a cell takes besides its code. */
export interface CellOptions extends CallOptions {
  /** This cell's wall clock in the sandbox (by default the session's `limits.timeout_ms`);
   * reaching it ends the session. Not to be confused with `timeoutMs`, how long the client
   * waits: aborting a cell (a signal, `timeoutMs`) disconnects, which closes the session. */
  timeout_ms?: number | undefined;
  /** Function mode: the function to call after the cell ran... */
  entrypoint?: string | undefined;
  /** ...with these keyword arguments (plain JSON data). */
  inputs?: Record<string, unknown> | undefined;
}

/** What a streamed cell takes. */
export interface CellStreamOptions extends CellOptions {
  /** Called with each of the cell's tool calls that waits for an approval, as it is read. */
  onApproval?: OnApproval | undefined;
}

/** A cell's execution: an `Execution`, and whether the cell ended the session or brought a
 * paused one back first. */
export interface CellExecution extends Execution {
  /** The cell ended the session (a limit, `sys.exit()`, a crash: `status` says which); later
   * requests get `SessionEndedError`. */
  session_ended: boolean;
  /** Present when this cell brought the paused session back first. */
  resumed?: SnapshotInfo | null;
}

/** Opens a session (`Airlock.session`). */
export async function openSession(transport: Transport, options: SessionOptions = {}): Promise<Session> {
  const { code: _, ...body } = executeBody("", {
    limits: options.limits,
    files: options.files,
    env: options.env,
    environment: options.environment,
    egress: options.egress,
    credentials: options.credentials,
    volumes: options.volumes,
  });
  const request: Record<string, unknown> = body;
  if (options.idle_timeout_ms !== undefined) request["idle_timeout_ms"] = options.idle_timeout_ms;
  if (options.max_lifetime_ms !== undefined) request["max_lifetime_ms"] = options.max_lifetime_ms;
  const answer = await transport.request({ method: "POST", path: "/v1/sessions", json: request, ok: [201] }, "json", options);
  return new Session(transport, toSessionInfo(answer.body));
}

/** A handle on this key's session `id`, open or paused (`Airlock.sessionById`). */
export async function sessionById(transport: Transport, id: string, options: CallOptions = {}): Promise<Session> {
  return new Session(transport, await getInfo(transport, id, options));
}

/** This key's sessions, open and paused (`Airlock.sessions`). A paused one is listed without
 * its variables' names (`Session.refresh` has them). */
export async function listSessions(transport: Transport, options: CallOptions = {}): Promise<SessionInfo[]> {
  const answer = await transport.request({ method: "GET", path: "/v1/sessions" }, "json", options);
  return array(object(answer.body, "$")["sessions"], "$.sessions").map((s, i) => toSessionInfo(s, `$.sessions[${i}]`));
}

/** One sandbox and interpreter kept for many cells: variables, imports and files persist.
 * One request at a time (another gets `SessionBusyError`). `close()` destroys it; `pause()`
 * frees its sandbox and keeps its state on the server's disk (across restarts too), and its
 * next request brings it back; `fork()` makes another session with the same state. */
export class Session extends FileHolder {
  /** The session's id (`se_...`). */
  readonly id: string;
  /** The session as last read: on opening, `refresh()`, `pause()`, `resume()`. */
  info: SessionInfo;
  /** Whether `close()` closed it. */
  closed = false;
  readonly #transport: Transport;

  /** A handle on the session `info` describes (`Airlock.session`, `sessionById` make them).
   * Its files are below its working directory, `/work`; a paused session is brought back
   * by any request of them, and the server caps downloads at half the result limit. */
  constructor(transport: Transport, info: SessionInfo) {
    super(transport, sessionPath(info.id));
    this.#transport = transport;
    this.id = info.id;
    this.info = info;
  }

  /** Runs a cell in the session's interpreter and returns its execution, whatever its
   * status (see `session_ended`, and `resumed` when it brought a paused session back). */
  async run(code: string, options: CellOptions = {}): Promise<CellExecution> {
    const answer = await this.#transport.request(
      { method: "POST", path: `${sessionPath(this.id)}/execute`, json: cellBody(code, options) },
      "json",
      options,
    );
    const execution = toExecution(answer.body, answer.requestId) as CellExecution;
    if (typeof execution.session_ended !== "boolean") execution.session_ended = false;
    return execution;
  }

  /** Function mode: runs `code` as a cell, then returns `entrypoint(**args)`, decoded; throws
   * `ExecutionFailedError` (with the execution) unless it ended `ok`. */
  async call(
    code: string,
    entrypoint: string,
    args: Record<string, unknown> = {},
    options: Omit<CellOptions, "entrypoint" | "inputs"> = {},
  ): Promise<Value> {
    return valueOf(await this.run(code, { ...options, entrypoint, inputs: args }), entrypoint);
  }

  /** As `run`, with the output as it is written (see `Airlock.stream`). Leaving the loop
   * early disconnects, which closes the session. */
  stream(code: string, options: CellStreamOptions = {}): ExecutionStream {
    const body = cellBody(code, options);
    return new ExecutionStream(
      () => this.#transport.events({ method: "POST", path: `${sessionPath(this.id)}/execute`, json: body }, options),
      options.onApproval,
    );
  }

  /** Everything below the working directory (links listed, never followed). */
  async files(options: CallOptions = {}): Promise<FileEntry[]> {
    return (await this.listFiles(options)).files as FileEntry[];
  }

  /** The session as the server holds it now. */
  async refresh(options: CallOptions = {}): Promise<SessionInfo> {
    this.info = await getInfo(this.#transport, this.id, options);
    return this.info;
  }

  /** Writes the session's state (variables, functions, classes, imported modules, the files
   * of `/work` and `/tmp`) to a snapshot in its own sandbox, then frees the sandbox; its next
   * cell, file request or `resume()` brings it back. `paused.not_kept` names what could not
   * be kept. `QuotaExceededError` when the state is over the key's storage (the session runs
   * on as it was), `SessionBusyError` while another request of it runs. */
  pause(options: CallOptions = {}): Promise<SessionInfo> {
    return this.#post("pause", 200, options);
  }

  /** Brings a paused session back in a fresh sandbox: `resumed` says what came back (null
   * when it was open). `SnapshotInvalidError` when its snapshot was altered. */
  resume(options: CallOptions = {}): Promise<SessionInfo> {
    return this.#post("resume", 200, options);
  }

  /** A new session with this one's state (open or paused; this one goes on as it was): its
   * `info.resumed` says what it holds. */
  async fork(options: CallOptions = {}): Promise<Session> {
    const answer = await this.#transport.request(
      { method: "POST", path: `${sessionPath(this.id)}/fork`, ok: [201] },
      "json",
      options,
    );
    return new Session(this.#transport, toSessionInfo(answer.body));
  }

  /** Destroys the sandbox before answering, or deletes a paused session's snapshot. Closing
   * twice, or a session the server already closed or lost, is not an error. */
  async close(options: CallOptions = {}): Promise<void> {
    if (this.closed) return;
    try {
      await this.#transport.request({ method: "DELETE", path: sessionPath(this.id), ok: [204] }, "none", options);
    } catch (e) {
      if (!(e instanceof NotFoundError || e instanceof SessionLostError)) throw e;
    }
    this.closed = true;
  }

  async #post(what: "pause" | "resume", status: number, options: CallOptions): Promise<SessionInfo> {
    const answer = await this.#transport.request(
      { method: "POST", path: `${sessionPath(this.id)}/${what}`, ok: [status] },
      "json",
      options,
    );
    this.info = toSessionInfo(answer.body);
    return this.info;
  }
}

function sessionPath(id: string): string {
  return `/v1/sessions/${segment(id, "a session id")}`;
}

async function getInfo(transport: Transport, id: string, options: CallOptions): Promise<SessionInfo> {
  const answer = await transport.request({ method: "GET", path: sessionPath(id) }, "json", options);
  return toSessionInfo(answer.body);
}

function toSessionInfo(value: unknown, where = "$"): SessionInfo {
  const body = object(value, where);
  if (typeof body["id"] !== "string") expected(`${where}.id`, "a string");
  return body as unknown as SessionInfo;
}

function cellBody(code: string, options: CellOptions): Record<string, unknown> {
  if (typeof code !== "string") throw new TypeError("code is a string");
  const body: Record<string, unknown> = { code };
  if (options.timeout_ms !== undefined) body["timeout_ms"] = options.timeout_ms;
  if (options.entrypoint !== undefined) {
    body["entrypoint"] = options.entrypoint;
    body["inputs"] = options.inputs ?? {};
  } else if (options.inputs !== undefined) {
    throw new TypeError("inputs are the keyword arguments of an entrypoint: name one");
  }
  return body;
}
