// Background executions (docs/http-api.md, "Background executions"): submitted, answered at
// once, and run to their end on the server whether or not anyone follows them; followed by
// their events (resumed with `Last-Event-ID` after a lost connection, each event once),
// waited for, cancelled, and found again by id, across server restarts too.

import { executeBody, type RunOptions } from "./request.js";
import {
  AirlockError,
  ClientTimeoutError,
  ERROR_CODES,
  NotFoundError,
  ProtocolError,
  ServiceUnavailableError,
  TransportError,
  errorFor,
} from "./errors.js";
import { expected } from "./files.js";
import { segment, type CallOptions, type EventStream, type Transport } from "./http.js";
import { object, toExecution } from "./results.js";
import { parseStreamEvent } from "./stream.js";
import type { operations } from "./openapi.gen.js";
import type { AppliedLimits, Approval, Execution } from "./types.js";

/** Where a background execution is: `queued`, `running`, then `finished` (it ran: its
 * result, whatever its status), `failed` (airlock could not run it), `cancelled` or
 * `interrupted` (the server stopped while it waited or ran). */
export type BackgroundState = "queued" | "running" | "finished" | "failed" | "cancelled" | "interrupted";

/** Why a background execution ended without a result: airlock's error `code` and `message`. */
export interface BackgroundFailure {
  code: string;
  message: string;
}

type RawInfo = operations["submitExecution"]["responses"][202]["content"]["application/json"];

/** A background execution's state as the server holds it (`GET /v1/executions/{id}`). */
export interface BackgroundInfo extends Omit<RawInfo, "state" | "limits" | "error" | "result"> {
  state: BackgroundState;
  /** The limits it runs with. */
  limits: AppliedLimits;
  /** Why it ended without a result (`failed`, `cancelled` before it ran, `interrupted`). */
  error?: BackgroundFailure;
  /** Its whole result (output and all, decoded) once it ran; a cancelled run's too. */
  result?: Execution;
  /** Whether it ended (any state but `queued` and `running`). */
  ended: boolean;
}

/** One event of a background execution, with its `id` (what `events({ after })` resumes
 * after): output as the program wrote it, a truncation, an approval its tool call waits for,
 * and last the result (its `execution` without the output, which came as events:
 * `output_streamed` is true; `wait()` has it whole) or, when it ended without one, the error
 * (`cancelled`, `interrupted`, `storage_full`, ...) as an event, not thrown. Display outputs
 * are in the result's `outputs`. */
export type BackgroundEvent = { id: string } & (
  | { type: "stdout" | "stderr"; text: string }
  | { type: "truncated"; stream: "stdout" | "stderr"; limit: number }
  | { type: "approval"; approval: Approval }
  | { type: "result"; execution: Execution }
  | { type: "error"; code: string; message: string; error: AirlockError }
);

/** What `events()` takes. */
export interface EventsOptions {
  /** Resume after the event with this id (a `lastEventId` or an event's `id` kept from an
   * earlier follower, in any process); from the first event when absent. */
  after?: string | undefined;
  /** Stops following: the iteration rejects with the signal's reason. The execution goes on. */
  signal?: AbortSignal | undefined;
}

/** What `wait()` takes. */
export interface WaitOptions {
  /** Give up after this long (ms) with a `WaitTimeoutError`; the execution goes on. */
  timeoutMs?: number | undefined;
  /** Stops waiting (the execution goes on): rejects with the signal's reason. */
  signal?: AbortSignal | undefined;
}

/** `wait()` on a background execution that ended without a result: `failed`, `cancelled` or
 * `interrupted` (`state`); `code` is the server's (`storage_full`, `cancelled`,
 * `interrupted`, ...), `execution` the killed run of one cancelled while it ran. */
export class BackgroundNotFinishedError extends AirlockError {
  override name = "BackgroundNotFinishedError";
  /** The background execution's id. */
  readonly executionId: string;
  /** How it ended. */
  readonly state: BackgroundState;
  /** The execution as far as it ran, when it ran (a cancelled run's, killed). */
  readonly execution: Execution | undefined;

  constructor(executionId: string, state: BackgroundState, failure: BackgroundFailure | undefined, execution?: Execution) {
    const code = failure?.code ?? state;
    const again = state === "interrupted" ? " (the server stopped while it waited or ran: submit it again)" : "";
    super(`${executionId} ended ${state}: ${failure ? `${failure.code}: ${failure.message}` : "no result"}${again}`, {
      code,
      status: (Object.hasOwn(ERROR_CODES, code) ? ERROR_CODES[code]?.[1] : undefined) ?? 200,
    });
    this.executionId = executionId;
    this.state = state;
    this.execution = execution;
  }
}

/** `wait({ timeoutMs })` gave up; the execution goes on (`state` is what it was last seen). */
export class WaitTimeoutError extends AirlockError {
  override name = "WaitTimeoutError";
  /** The background execution's id. */
  readonly executionId: string;
  constructor(executionId: string, timeoutMs: number) {
    super(`${executionId} did not end within ${timeoutMs} ms; it goes on`, { code: "wait_timeout" });
    this.executionId = executionId;
  }
}

// The pauses before each attempt to reconnect while nothing comes (ms), then a TransportError.
const RECONNECT_PAUSES = [0, 0, 250, 500, 1000, 2000, 4000];
// After the last event, the pauses between reads of the state until it says it ended (it is
// written just after the event).
const ENDING_PAUSES = [10, 20, 50, 100, 200, 500, 1000, 0];
const ENDED: ReadonlySet<string> = new Set(["finished", "failed", "cancelled", "interrupted"]);

/** Submits `code` to run in the background (`Airlock.submit`). */
export async function submit(transport: Transport, code: string, options: RunOptions = {}): Promise<BackgroundExecution> {
  const answer = await transport.request(
    { method: "POST", path: "/v1/executions", json: executeBody(code, options), ok: [202] },
    "json",
    options,
  );
  const info = toInfo(answer.body);
  return new BackgroundExecution(transport, info.id, info);
}

/** A background execution of this key's, by `id`: it runs on the server whether or not
 * anyone follows it. Refusals of any call are thrown as the client's errors:
 * `NotFoundError` once it was deleted (`cancel()`), or for an id of another key's. */
export class BackgroundExecution {
  /** Its id (`ex_...`). */
  readonly id: string;
  /** Its state as last read (`submit`, `refresh`, `cancel`); undefined for a handle made by
   * id until then. */
  info: BackgroundInfo | undefined;
  readonly #transport: Transport;
  #deleted: BackgroundInfo | undefined;

  /** A handle on the execution `id` (`Airlock.submit` and `Airlock.background` make them). */
  constructor(transport: Transport, id: string, info?: BackgroundInfo) {
    segment(id, "an execution id");
    this.#transport = transport;
    this.id = id;
    this.info = info;
  }

  /** Its state now, with its whole result once it ran. */
  async refresh(options: CallOptions = {}): Promise<BackgroundInfo> {
    const answer = await this.#transport.request({ method: "GET", path: this.#path() }, "json", options);
    this.info = toInfo(answer.body, this.id);
    return this.info;
  }

  /** Its events, from the first or `after` one, followed to its end; see `BackgroundEvents`. */
  events(options: EventsOptions = {}): BackgroundEvents {
    return new BackgroundEvents(this.#transport, this.id, options);
  }

  /** Follows it to its end and returns its `Execution`, as `run` would have answered (the
   * whole output, read once more at the end). Throws `BackgroundNotFinishedError` when it
   * ended `failed`, `cancelled` or `interrupted`, `NotFoundError` when it was deleted
   * meanwhile, and `WaitTimeoutError` after `timeoutMs` (the execution goes on). */
  async wait(options: WaitOptions = {}): Promise<Execution> {
    if (this.#deleted !== undefined) throw deleted(this.#deleted);
    const stop = new Stop(options.signal, options.timeoutMs, () => new WaitTimeoutError(this.id, options.timeoutMs ?? 0));
    let ending: BackgroundEvent | undefined;
    try {
      const call = { signal: stop.signal };
      let info = await this.refresh(call);
      if (info.ended) return outcome(info);
      for await (const event of this.events(call)) ending = event;
      for (const pause of ENDING_PAUSES) {
        info = await this.refresh(call);
        if (info.ended) break;
        await stop.sleep(pause);
      }
      return outcome(info);
    } catch (e) {
      if (e instanceof NotFoundError && ending?.type === "error") {
        throw new BackgroundNotFinishedError(this.id, stateOf(ending.code), { code: ending.code, message: ending.message });
      }
      throw e;
    } finally {
      stop.release();
    }
  }

  /** Cancels it if it is queued or running (its sandbox is killed) and deletes it, its result
   * and events with it: read what you need first. Its last state: `cancelled`, or how it had
   * ended (`running` when it was still ending after 10 s: deleted once it ends). Once. */
  async cancel(options: CallOptions = {}): Promise<BackgroundInfo> {
    if (this.#deleted === undefined) {
      const answer = await this.#transport.request({ method: "DELETE", path: this.#path(), ok: [200, 202] }, "json", options);
      this.#deleted = toInfo(answer.body, this.id);
      this.info = this.#deleted;
    }
    return this.#deleted;
  }

  #path(): string {
    return `/v1/executions/${segment(this.id, "an execution id")}`;
  }
}

/** The events of a background execution, from its log on the server; iterate it once (`for
 * await`). It follows the execution while it runs, and after a lost connection (or a server
 * restarting) reconnects by itself with `Last-Event-ID` (at once, then for a few seconds
 * while nothing comes, then a `TransportError`), so that each event comes exactly once. A
 * connection that reaches the client's `timeoutMs` is opened again, as no failure.
 * `lastEventId` is the id of the last event given. Leaving the loop only stops following. */
export class BackgroundEvents implements AsyncIterable<BackgroundEvent> {
  /** The execution's id. */
  readonly id: string;
  /** The id of the last event given (or the `after` it started from). */
  lastEventId: string | undefined;
  /** Connections opened again after one was lost. */
  reconnections = 0;
  readonly #transport: Transport;
  readonly #signal: AbortSignal | undefined;
  #started = false;
  #stream: EventStream | undefined;
  #closed = false;

  /** The events of the execution `id` (`BackgroundExecution.events` makes them). */
  constructor(transport: Transport, id: string, options: EventsOptions = {}) {
    if (options.after !== undefined && !/^[0-9]{1,20}$/.test(options.after)) {
      throw new TypeError(`after is an event's id (digits): ${JSON.stringify(options.after)}`);
    }
    this.#transport = transport;
    this.id = id;
    this.lastEventId = options.after;
    this.#signal = options.signal;
  }

  /** Stops following (the execution goes on). */
  close(): void {
    this.#closed = true;
    this.#stream?.close();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<BackgroundEvent, void, undefined> {
    if (this.#started) throw new TypeError("a background execution's events are iterated once");
    this.#started = true;
    let quiet = 0; // connections in a row that failed before bringing an event
    for (;;) {
      if (this.#closed) return;
      const pause = RECONNECT_PAUSES[quiet];
      if (pause === undefined) {
        throw new TransportError(`the events of ${this.id} were lost, and reconnecting failed`, { code: "transport_error" });
      }
      if (pause > 0) await sleep(pause, this.#signal);
      let stream: EventStream;
      try {
        stream = await this.#open();
      } catch (e) {
        if (this.#signal?.aborted || !(e instanceof TransportError || e instanceof ServiceUnavailableError)) throw e;
        quiet += 1;
        continue;
      }
      this.#stream = stream;
      let got = false;
      try {
        for await (const sse of stream) {
          if (!/^[0-9]{1,20}$/.test(sse.id ?? "")) throw new ProtocolError(`a ${sse.event.slice(0, 40)} event without an id that is a number`, { code: "protocol_error", status: 200 });
          const event = toEvent(sse.event, sse.data, sse.id as string, stream.requestId);
          got = true;
          quiet = 0;
          this.lastEventId = event.id;
          yield event;
          if (event.type === "result" || event.type === "error") return;
        }
        // Ended whole with nothing after the event it resumed after: that was the last.
        if (!got) return;
        // Ended before its last event (a proxy's doing): resume.
        quiet += 1;
      } catch (e) {
        if (this.#closed || this.#signal?.aborted || !(e instanceof TransportError)) throw e;
        // A connection that reached its own timeout is no sign of trouble.
        if (!(e instanceof ClientTimeoutError)) quiet += 1;
      } finally {
        stream.close();
        this.#stream = undefined;
      }
      this.reconnections += 1;
    }
  }

  #open(): Promise<EventStream> {
    const headers: Record<string, string> = {};
    if (this.lastEventId !== undefined) headers["Last-Event-ID"] = this.lastEventId;
    return this.#transport.events(
      { method: "GET", path: `/v1/executions/${segment(this.id, "an execution id")}/events`, headers },
      { signal: this.#signal },
      true,
    );
  }
}

/** The event a server-sent event of an execution's log stands for (one airlock does not send
 * is a `ProtocolError`). */
function toEvent(name: string, data: string, id: string, requestId: string | undefined): BackgroundEvent {
  if (name === "error") {
    let body: unknown;
    try {
      body = JSON.parse(data);
    } catch {
      expected("$(error event)", "JSON");
    }
    const error = object(object(body, "$(error event)")["error"], "$(error event).error");
    const code = typeof error["code"] === "string" ? error["code"] : "internal";
    const message = typeof error["message"] === "string" ? error["message"] : "";
    return { id, type: "error", code, message, error: errorFor(code, message, { requestId }) };
  }
  const event = parseStreamEvent({ event: name, data, id, retry: undefined }, requestId);
  if (event.type === "result") return { id, type: "result", execution: toExecution(event.body, requestId, "$(result event)") };
  return { id, ...event };
}

function toInfo(value: unknown, id?: string): BackgroundInfo {
  const body = object(value, "$");
  if (typeof body["id"] !== "string") expected("$.id", "a string");
  if (body["background"] !== true) {
    expected("$.background", `true (${String(body["id"])} is not a background execution: Airlock.execution() reads its audit record)`);
  }
  const state = body["state"];
  if (typeof state !== "string") expected("$.state", "a string");
  const info = { ...body, ended: ENDED.has(state) } as unknown as BackgroundInfo;
  if (body["error"] !== undefined && body["error"] !== null) {
    const error = object(body["error"], "$.error");
    info.error = { code: String(error["code"] ?? "internal"), message: String(error["message"] ?? "") };
  }
  if (body["result"] !== undefined && body["result"] !== null) {
    // The stored result leaves out its id: the execution's.
    const result = object(body["result"], "$.result");
    info.result = toExecution({ id: id ?? body["id"], ...result }, undefined, "$.result");
  }
  return info;
}

/** The execution of one that ended: its result once `finished`; the error of any other end. */
function outcome(info: BackgroundInfo): Execution {
  if (info.state === "finished") {
    if (info.result === undefined) expected("$.result", "the result where the state is finished");
    return info.result;
  }
  if (!info.ended) expected("$.state", `an end, not ${info.state}`);
  throw new BackgroundNotFinishedError(info.id, info.state, info.error, info.result);
}

/** What `wait()` throws for an execution its own handle deleted (`cancel()`). */
function deleted(info: BackgroundInfo): AirlockError {
  if (info.state === "finished") {
    return new NotFoundError(`404 not_found: ${info.id} finished and was deleted by cancel(); its result is gone`, {
      code: "not_found",
      status: 404,
    });
  }
  return new BackgroundNotFinishedError(info.id, info.ended ? info.state : "cancelled", info.error, info.result);
}

function stateOf(code: string): BackgroundState {
  return code === "cancelled" || code === "interrupted" ? code : "failed";
}

/** A caller's signal and a timeout, as one signal (`AbortSignal.any` is not in every runtime
 * this client runs on). */
class Stop {
  readonly #controller = new AbortController();
  readonly #release: () => void;

  constructor(outer: AbortSignal | undefined, timeoutMs: number | undefined, onTimeout: () => unknown) {
    if (outer?.aborted) this.#controller.abort(outer.reason);
    const onAbort = (): void => this.#controller.abort(outer?.reason);
    outer?.addEventListener("abort", onAbort, { once: true });
    const timer = timeoutMs === undefined ? undefined : setTimeout(() => this.#controller.abort(onTimeout()), timeoutMs);
    this.#release = () => {
      outer?.removeEventListener("abort", onAbort);
      if (timer !== undefined) clearTimeout(timer);
    };
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  sleep(ms: number): Promise<void> {
    return sleep(ms, this.signal);
  }

  release(): void {
    this.#release();
  }
}

/** Waits `ms`, or rejects with `signal`'s reason as soon as it aborts. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
