// A streamed execution (`POST /v1/execute` or a session's cell with `Accept:
// text/event-stream`): the server's events read into typed `StreamEvent`s, the result last.

import { ERROR_CODES, ProtocolError, TransportError, errorFor, printable } from "./errors.js";
import type { EventStream } from "./http.js";
import { parseJson } from "./json.js";
import { object, toExecution } from "./results.js";
import type { SseEvent } from "./sse.js";
import type { Approval, Execution, StreamEvent } from "./types.js";

/** Called with each approval request of a stream as it is read (the call waits until another
 * key decides it). Not awaited before the stream goes on; a promise it returns is awaited
 * before the result is given, and its failure ends the stream with it. */
export type OnApproval = (approval: Approval) => unknown;

/** The event a server-sent event of an execution's stream stands for: an output event, an
 * approval request, the raw result (`{ type: "result", body }`) or the error it carries
 * (thrown); an event airlock does not send is a `ProtocolError`. Shared by every stream of
 * executions (in place, cells, background). */
export function parseStreamEvent(
  event: SseEvent,
  requestId?: string,
): Exclude<StreamEvent, { type: "result" } | { type: "display" }> | { type: "result"; body: Record<string, unknown> } {
  const name = JSON.stringify(printable(event.event, 40));
  if (!EVENTS.has(event.event)) throw bad(`an unknown event ${name}`);
  let data: unknown;
  try {
    // Exact, as answers are: a result's big integers stay whole.
    data = parseJson(event.data);
  } catch {
    throw bad(`a ${name} event is not JSON`);
  }
  const where = `$(${event.event} event)`;
  switch (event.event) {
    case "stdout":
    case "stderr": {
      const body = object(data, where);
      const text = body["text"];
      if (typeof text !== "string" || Object.keys(body).length !== 1) throw bad(`${where}: expected {"text": string}`);
      return { type: event.event, text };
    }
    case "truncated": {
      const body = object(data, where);
      const stream = body["stream"];
      const limit = body["limit"];
      if ((stream !== "stdout" && stream !== "stderr") || !Number.isSafeInteger(limit) || Object.keys(body).length !== 2) {
        throw bad(`${where}: expected {"stream": "stdout"|"stderr", "limit": number}`);
      }
      return { type: "truncated", stream, limit: limit as number };
    }
    case "approval_requested": {
      const body = object(data, where);
      if (typeof body["id"] !== "string") throw bad(`${where}.id: expected a string`);
      return { type: "approval", approval: body as unknown as Approval };
    }
    case "result":
      return { type: "result", body: object(data, where) };
    case "error": {
      const error = object(object(data, where)["error"], `${where}.error`);
      const code = typeof error["code"] === "string" ? error["code"] : "internal";
      const message = typeof error["message"] === "string" ? error["message"] : "";
      const known = Object.hasOwn(ERROR_CODES, code) ? ERROR_CODES[code] : undefined;
      throw errorFor(code, message, {
        status: known?.[1] ?? 500,
        requestId: typeof error["request_id"] === "string" ? error["request_id"] : requestId,
        field: typeof error["field"] === "string" ? error["field"] : undefined,
      });
    }
    default:
      throw bad(`an unknown event ${name}`);
  }
}

// The events airlock's streams carry (docs/http-api.md, "Streaming").
const EVENTS: ReadonlySet<string> = new Set(["stdout", "stderr", "truncated", "approval_requested", "result", "error"]);

function bad(message: string): ProtocolError {
  return new ProtocolError(message, { code: "protocol_error", status: 200 });
}

/** The events of one streamed execution; iterate it once (`for await`). Its output arrives as
 * the program writes it, then its display outputs and its `Execution` (with the streamed
 * output put back into `stdout` and `stderr`). A refusal of the request (400, 401, 429, ...)
 * is thrown by the first step; a connection lost mid-stream by the step that was waiting, as
 * a `TransportError`, and a stream that ends before its result as a `ProtocolError`. Leaving
 * the loop early (or `close()`) disconnects, which kills the sandbox. */
export class ExecutionStream implements AsyncIterable<StreamEvent> {
  /** The result, once the stream gave it. */
  execution: Execution | undefined;
  readonly #open: () => Promise<EventStream>;
  readonly #onApproval: OnApproval | undefined;
  #stream: EventStream | undefined;
  #started = false;
  #closed = false;

  /** A stream of the events `open` opens, when first iterated. */
  constructor(open: () => Promise<EventStream>, onApproval?: OnApproval) {
    this.#open = open;
    this.#onApproval = onApproval;
  }

  /** Disconnects: the server kills the sandbox. */
  close(): void {
    this.#closed = true;
    this.#stream?.close();
  }

  /** Reads the stream to its end and returns the execution. */
  async result(): Promise<Execution> {
    if (!this.#started) {
      for await (const _ of this) {
        // Output events are in the execution too.
      }
    }
    if (this.execution === undefined) throw bad("the stream ended before its result");
    return this.execution;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<StreamEvent, void, undefined> {
    if (this.#started) throw new TypeError("a stream is iterated once");
    this.#started = true;
    if (this.#closed) throw new TransportError("the stream was closed by its client", { code: "closed" });
    const stream = await this.#open();
    this.#stream = stream;
    const output = { stdout: [] as string[], stderr: [] as string[] };
    const handlers: Promise<unknown>[] = [];
    let failed: unknown;
    try {
      let execution: Execution | undefined;
      for await (const sse of stream) {
        // The result is the last event: the stream ends with it, or it is not airlock's.
        if (execution !== undefined) throw bad(`an event after the stream's result (${printable(sse.event, 40)})`);
        if (failed !== undefined) throw failed;
        const event = parseStreamEvent(sse, stream.requestId);
        if (event.type === "result") {
          await Promise.all(handlers);
          if (failed !== undefined) throw failed;
          execution = toExecution(event.body, stream.requestId, "$(result event)");
          continue;
        }
        if (event.type === "stdout" || event.type === "stderr") output[event.type].push(event.text);
        if (event.type === "approval" && this.#onApproval !== undefined) {
          handlers.push(
            Promise.resolve()
              .then(() => this.#onApproval?.(event.approval))
              .catch((e: unknown) => {
                failed ??= e;
              }),
          );
        }
        yield event;
      }
      if (failed !== undefined) throw failed;
      if (execution === undefined) throw bad("the stream ended before its result");
      if (execution.output_streamed === true) {
        execution.stdout = output.stdout.join("") + execution.stdout;
        execution.stderr = output.stderr.join("") + execution.stderr;
      }
      this.execution = execution;
      for (const out of execution.outputs) yield { type: "display", output: out };
      yield { type: "result", execution };
    } finally {
      stream.close();
    }
  }
}
