// The one way the client talks to the server: `Transport.request` (JSON or bytes in, JSON,
// bytes or nothing out) and `Transport.events` (server-sent events), both on `fetch`, with
// the key, typed errors, retries of the refusals airlock makes before it starts anything,
// an `AbortSignal` and a timeout on every call, and answers bounded in size.

import {
  AirlockError,
  ClientTimeoutError,
  ProtocolError,
  TransportError,
  errorFromAnswer,
  printable,
} from "./errors.js";
import { readEvents, type SseEvent } from "./sse.js";
import { parseJson as parseExact } from "./json.js";

/** The `fetch` the transport calls: the platform's, or one passed in (edge runtimes, tests). */
export type Fetch = (input: string, init: RequestInit) => Promise<Response>;

/** How the transport reaches the server and how patient it is. */
export interface TransportOptions {
  /** The server's URL, e.g. `http://127.0.0.1:8080` (a path prefix is kept). */
  baseUrl: string;
  /** The API key, sent as `Authorization: Bearer <key>`. */
  apiKey: string;
  /** The `fetch` to use; the global one by default. */
  fetch?: Fetch | undefined;
  /** How many times a refusal that may be retried (below) is sent again; 2 by default. */
  maxRetries?: number | undefined;
  /** The longest `Retry-After` the client waits for before sending again (ms); a longer one
   * is thrown at once. 10 000 by default. */
  maxRetryWaitMs?: number | undefined;
  /** Every call's timeout (ms), from sending it to the last byte of its answer (a stream's
   * included); none by default (executions end at their own `timeout_ms`). */
  timeoutMs?: number | undefined;
  /** The most bytes an answer read whole may take; 64 MiB by default. */
  maxResponseBytes?: number | undefined;
}

/** What every call of the client takes besides its own arguments. */
export interface CallOptions {
  /** Aborts the call (and, for an execution answered in place or streamed, the execution:
   * the server kills a sandbox whose client went away). The promise or the iterator
   * rejects with the signal's reason. */
  signal?: AbortSignal | undefined;
  /** This call's timeout (ms), from sending it to the last byte of its answer; passing it
   * aborts the call as a signal would, with a `ClientTimeoutError`. */
  timeoutMs?: number | undefined;
}

/** One request of the API. */
export interface ApiRequest {
  method: "GET" | "POST" | "PUT" | "DELETE";
  /** The path below the base URL, starting with `/`; segments already encoded (`segment`). */
  path: string;
  /** A JSON body (`Content-Type: application/json`). */
  json?: unknown;
  /** A raw body (`application/octet-stream` unless `contentType` says otherwise). A stream
   * is sent as it is read, and such a request is never retried. */
  body?: Uint8Array | string | Blob | ReadableStream<Uint8Array> | undefined;
  contentType?: string | undefined;
  /** More headers (`Last-Event-ID`, ...). */
  headers?: Record<string, string> | undefined;
  /** The statuses that answer this call; 200 by default. Any other below 400 is a
   * `ProtocolError` (redirects are not followed: the key goes only where the URL says). */
  ok?: readonly number[] | undefined;
}

/** An answer: its status, headers, the server's request id and its body as asked for. */
export interface Answer<T> {
  status: number;
  headers: Headers;
  /** `X-Request-Id`: the server's id of the request, as its log and audit lines name it. */
  requestId: string | undefined;
  body: T;
}

/** How an answer's body is read: parsed JSON (`application/json` only), bytes, or nothing
 * (the body is dropped: a 204, a 202). */
export type BodyKind = "json" | "bytes" | "none";

/** An open stream of server-sent events; iterate it once. `close()` (or leaving a `for
 * await` early) disconnects, which makes the server kill an execution's sandbox. */
export interface EventStream extends AsyncIterable<SseEvent> {
  readonly status: number;
  readonly headers: Headers;
  readonly requestId: string | undefined;
  /** Disconnects; iteration ends with the stream's `TransportError` if it was under way. */
  close(): void;
}

/** The defaults, as documented on `TransportOptions`. */
export const DEFAULTS = Object.freeze({
  maxRetries: 2,
  maxRetryWaitMs: 10_000,
  maxResponseBytes: 64 << 20,
});

// The most of an error answer's body that is read (its message is quoted from it).
const ERROR_BODY_MAX = 1 << 20;

/** A path segment as the server's routes take it, percent-encoded; `""`, `.` and `..` (which
 * URL normalisation would remove, reaching another route) are refused. */
export function segment(value: string, what: string = "a path segment"): string {
  if (typeof value !== "string" || value === "" || value === "." || value === "..") {
    throw new TypeError(`${what} must be a non-empty string other than "." and ".."`);
  }
  return encodeURIComponent(value);
}

/** A relative file path (a session's or a volume's) as the server takes it: no `..`, `.` or
 * empty parts, each part percent-encoded. */
export function filePath(path: string, what: string = "a file path"): string {
  const parts = typeof path === "string" ? path.split("/") : [];
  if (parts.length === 0 || parts.some((p) => p === "" || p === "." || p === "..")) {
    throw new TypeError(`${what} is relative, without "..", "." or empty parts: ${JSON.stringify(path)}`);
  }
  return parts.map((p) => encodeURIComponent(p)).join("/");
}

/** Parses an answer's JSON text, integers past 2^53 exact (as `bigint`s); the one place JSON
 * becomes values. */
export function parseJson(text: string): unknown {
  try {
    return parseExact(text);
  } catch (e) {
    throw new ProtocolError(`the answer is not valid JSON: ${String(e).slice(0, 200)}`, {
      code: "protocol_error",
      status: 200,
    });
  }
}

/** The transport of one client: every request of the API goes through `request` or
 * `events`. */
export class Transport {
  readonly baseUrl: string;
  readonly maxRetries: number;
  readonly maxRetryWaitMs: number;
  readonly timeoutMs: number | undefined;
  readonly maxResponseBytes: number;
  readonly #apiKey: string;
  readonly #fetch: Fetch;

  constructor(options: TransportOptions) {
    const url = options.baseUrl.replace(/\/+$/, "");
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new TypeError(`the server's URL is not a URL: ${JSON.stringify(options.baseUrl)}`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new TypeError(`the server's URL must be http:// or https://, not ${JSON.stringify(options.baseUrl)}`);
    }
    // Checked here and never quoted: a fetch's error about a bad header could quote the key.
    if (!/^[\x21-\x7e]{1,4096}$/.test(options.apiKey)) {
      throw new TypeError("the API key must be printable ASCII without spaces (check for a trailing newline)");
    }
    this.baseUrl = url;
    this.#apiKey = options.apiKey;
    this.maxRetries = nonNegative(options.maxRetries ?? DEFAULTS.maxRetries, "maxRetries");
    this.maxRetryWaitMs = nonNegative(options.maxRetryWaitMs ?? DEFAULTS.maxRetryWaitMs, "maxRetryWaitMs");
    this.timeoutMs = options.timeoutMs === undefined ? undefined : positive(options.timeoutMs, "timeoutMs");
    this.maxResponseBytes = positive(options.maxResponseBytes ?? DEFAULTS.maxResponseBytes, "maxResponseBytes");
    const f = options.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new TypeError("no fetch in this runtime: pass one in the options");
    // Called unbound, some runtimes' fetch refuses to run ("Illegal invocation").
    this.#fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
  }

  /** Sends `req` and reads its answer whole: `json` (the default), `bytes` or `none`.
   * Refusals throw their `AirlockError`; 429 and 503 are sent again as their `Retry-After`
   * says, within the bounds. */
  async request(req: ApiRequest, kind: "json", options?: CallOptions): Promise<Answer<unknown>>;
  async request(req: ApiRequest, kind: "bytes", options?: CallOptions): Promise<Answer<Uint8Array>>;
  async request(req: ApiRequest, kind: "none", options?: CallOptions): Promise<Answer<undefined>>;
  async request(req: ApiRequest, kind: BodyKind, options: CallOptions = {}): Promise<Answer<unknown>> {
    const call = new Call(this, options);
    try {
      const response = await this.#send(req, call, kind === "json" ? "application/json" : "*/*");
      const base = {
        status: response.status,
        headers: response.headers,
        requestId: response.headers.get("x-request-id") ?? undefined,
      };
      if (kind === "none") {
        await response.body?.cancel().catch(() => undefined);
        return { ...base, body: undefined };
      }
      if (kind === "bytes") return { ...base, body: await call.read(response, this.maxResponseBytes) };
      const media = mediaType(response.headers);
      if (media !== "application/json") {
        await response.body?.cancel().catch(() => undefined);
        throw new ProtocolError(`expected application/json, got ${media || "no content type"}`, {
          code: "protocol_error",
          status: response.status,
          requestId: base.requestId,
        });
      }
      const bytes = await call.read(response, this.maxResponseBytes);
      return { ...base, body: parseJson(utf8(bytes)) };
    } finally {
      call.release();
    }
  }

  /** Sends `req` asking for server-sent events and returns the open stream once the server
   * accepted it (refusals throw here, before any event, and are retried as `request`'s are).
   * Iterating it yields each event; a connection lost mid-stream throws a `TransportError`,
   * the call's abort its signal's reason. The stream ending by itself ends the iteration: the
   * caller knows whether that was its last event. The whole stream may take
   * `maxResponseBytes`, or with `perEvent` (a background execution's log, which may go on for
   * hours) each of its events. */
  async events(req: ApiRequest, options: CallOptions = {}, perEvent = false): Promise<EventStream> {
    const call = new Call(this, options);
    let response: Response;
    try {
      response = await this.#send(req, call, "text/event-stream");
      const media = mediaType(response.headers);
      if (media !== "text/event-stream") {
        await response.body?.cancel().catch(() => undefined);
        throw new ProtocolError(`expected text/event-stream, got ${media || "no content type"}`, {
          code: "protocol_error",
          status: response.status,
          requestId: response.headers.get("x-request-id") ?? undefined,
        });
      }
    } catch (e) {
      call.release();
      throw e;
    }
    const body = response.body;
    const limits = { maxEventChars: this.maxResponseBytes, ...(perEvent ? {} : { maxStreamBytes: this.maxResponseBytes }) };
    let iterated = false;
    return {
      status: response.status,
      headers: response.headers,
      requestId: response.headers.get("x-request-id") ?? undefined,
      close: () => call.abort(new TransportError("the stream was closed by its client", { code: "closed" })),
      async *[Symbol.asyncIterator]() {
        if (iterated) throw new TypeError("an event stream is iterated once");
        iterated = true;
        try {
          if (body === null) return;
          yield* call.guard(readEvents(body, { ...limits, strict: true }));
        } finally {
          call.abort(new TransportError("the stream was left", { code: "closed" }));
          call.release();
        }
      },
    };
  }

  /** Sends `req` and gives its answer's body as a stream of bytes, read as the caller reads
   * it (not bounded by `maxResponseBytes`: the caller decides how much to take). The call's
   * signal and timeout hold until the stream ends or is cancelled; a connection lost
   * mid-stream errors it with a `TransportError`. */
  async stream(req: ApiRequest, options: CallOptions = {}): Promise<Answer<ReadableStream<Uint8Array>>> {
    const call = new Call(this, options);
    let response: Response;
    try {
      response = await this.#send(req, call, "*/*");
    } catch (e) {
      call.release();
      throw e;
    }
    const reader = response.body?.getReader();
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        try {
          const next = reader === undefined ? { done: true as const } : await call.do(() => reader.read());
          if (next.done) {
            call.release();
            controller.close();
          } else {
            controller.enqueue(next.value);
          }
        } catch (e) {
          call.release();
          controller.error(e);
        }
      },
      async cancel(reason) {
        call.release();
        await reader?.cancel(reason).catch(() => undefined);
      },
    });
    return {
      status: response.status,
      headers: response.headers,
      requestId: response.headers.get("x-request-id") ?? undefined,
      body,
    };
  }

  /** One exchange with retries: the response of a status the request expects (its body
   * unread), or the refusal thrown. */
  async #send(req: ApiRequest, call: Call, accept: string): Promise<Response> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.#apiKey}`,
      Accept: accept,
      // airlock answers uncompressed; fetch would otherwise ask for gzip and inflate a bomb
      // before the client counts a byte of it.
      "Accept-Encoding": "identity",
      ...req.headers,
    };
    let body: BodyInit | undefined;
    if (req.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(req.json);
    } else if (req.body !== undefined) {
      headers["Content-Type"] = req.contentType ?? "application/octet-stream";
      // Every runtime's fetch takes any Uint8Array; the DOM types ask for one on an ArrayBuffer.
      body = req.body as BodyInit;
    }
    const streamed = typeof ReadableStream !== "undefined" && body instanceof ReadableStream;
    const init: RequestInit & { duplex?: "half" } = {
      method: req.method,
      headers,
      redirect: "manual",
      signal: call.signal,
    };
    if (body !== undefined) init.body = body;
    if (streamed) init.duplex = "half";
    const ok = req.ok ?? [200];
    for (let attempt = 0; ; attempt++) {
      const response = await call.do(() => this.#fetch(this.baseUrl + req.path, init));
      const requestId = response.headers.get("x-request-id") ?? undefined;
      const encoding = (response.headers.get("content-encoding") ?? "identity").trim().toLowerCase();
      if (encoding !== "identity") {
        // Refused before a byte of it is read, so fetch inflates nothing.
        await response.body?.cancel().catch(() => undefined);
        throw new ProtocolError(`a compressed answer (${printable(encoding, 40)}), though none was asked for`, {
          code: "protocol_error",
          status: response.status,
          requestId,
        });
      }
      if (ok.includes(response.status)) return response;
      if (response.status < 400) {
        await response.body?.cancel().catch(() => undefined);
        throw new ProtocolError(
          `unexpected HTTP ${response.status} to ${req.method} ${req.path.split("?")[0]} (redirects are not followed)`,
          { code: "protocol_error", status: response.status, requestId },
        );
      }
      const text = utf8(await call.read(response, ERROR_BODY_MAX, true), false);
      const error = errorFromAnswer({ status: response.status, headers: response.headers, body: text });
      const wait = streamed ? undefined : this.#retryWait(error, req.method, attempt, call);
      if (wait === undefined) throw error;
      await call.sleep(wait);
    }
  }

  /** How long to wait before sending a refused request again, or undefined to throw. airlock
   * answers 429 and 503 with a `Retry-After` when it refused the request before starting
   * anything (docs/http-api.md), so sending it again cannot run it twice; a 429 or 503 that
   * is not airlock's own (a proxy's page) is retried only for a GET. */
  #retryWait(error: AirlockError, method: string, attempt: number, call: Call): number | undefined {
    if (attempt >= this.maxRetries) return undefined;
    if (error.status !== 429 && error.status !== 503) return undefined;
    const wait = error.retryAfterMs;
    if (wait === undefined || wait > this.maxRetryWaitMs) return undefined;
    if (error instanceof ProtocolError && method !== "GET") return undefined;
    if (!call.hasTimeFor(wait)) return undefined;
    return wait;
  }
}

/** One call's abort signal, timeout and deadline: the caller's signal and the timeout abort
 * its fetch, its reads and its waits. */
class Call {
  readonly #controller = new AbortController();
  readonly #deadline: number | undefined;
  readonly #release: () => void;

  constructor(transport: Transport, options: CallOptions) {
    const timeoutMs = options.timeoutMs ?? transport.timeoutMs;
    const outer = options.signal;
    if (outer?.aborted) {
      this.#controller.abort(outer.reason);
    }
    const onAbort = (): void => this.#controller.abort(outer?.reason);
    outer?.addEventListener("abort", onAbort, { once: true });
    let timer: ReturnType<typeof setTimeout> | undefined;
    if (timeoutMs !== undefined) {
      positive(timeoutMs, "timeoutMs");
      this.#deadline = Date.now() + timeoutMs;
      timer = setTimeout(
        () =>
          this.#controller.abort(
            new ClientTimeoutError(`no whole answer within the call's timeout of ${timeoutMs} ms`, {
              code: "client_timeout",
            }),
          ),
        timeoutMs,
      );
    }
    this.#release = () => {
      outer?.removeEventListener("abort", onAbort);
      if (timer !== undefined) clearTimeout(timer);
    };
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  abort(reason: unknown): void {
    this.#controller.abort(reason);
  }

  release(): void {
    this.#release();
  }

  hasTimeFor(ms: number): boolean {
    return this.#deadline === undefined || Date.now() + ms < this.#deadline;
  }

  /** Throws the abort's reason once the call was aborted. */
  check(): void {
    if (this.signal.aborted) throw this.signal.reason;
  }

  /** Runs a step of the call: an abort throws its reason, any other failure of the network
   * a `TransportError`. */
  async do<T>(step: () => Promise<T>): Promise<T> {
    this.check();
    try {
      return await step();
    } catch (e) {
      throw this.failure(e);
    }
  }

  failure(e: unknown): unknown {
    if (this.signal.aborted) return this.signal.reason;
    if (e instanceof AirlockError) return e;
    const why = e instanceof Error ? `${e.message}${causeText(e)}` : String(e);
    return new TransportError(`the connection failed: ${why}`, { code: "transport_error", cause: e });
  }

  /** Reads `response`'s body whole, at most `limit` bytes: past it a `ProtocolError`, or with
   * `cut` what came up to it. */
  async read(response: Response, limit: number, cut = false): Promise<Uint8Array> {
    const length = Number(response.headers.get("content-length") ?? NaN);
    if (!cut && length > limit) {
      await response.body?.cancel().catch(() => undefined);
      throw tooLarge(limit, response);
    }
    if (response.body === null) return new Uint8Array(0);
    const reader = response.body.getReader();
    const chunks: Uint8Array[] = [];
    let size = 0;
    try {
      for (;;) {
        const { done, value } = await this.do(() => reader.read());
        if (done) break;
        if (size + value.byteLength > limit) {
          if (!cut) throw tooLarge(limit, response);
          chunks.push(value.subarray(0, limit - size));
          size = limit;
          break;
        }
        chunks.push(value);
        size += value.byteLength;
      }
    } finally {
      await reader.cancel().catch(() => undefined);
      reader.releaseLock();
    }
    const out = new Uint8Array(size);
    let at = 0;
    for (const c of chunks) {
      out.set(c, at);
      at += c.byteLength;
    }
    return out;
  }

  /** Waits `ms`, or throws the abort's reason as soon as the call is aborted. */
  sleep(ms: number): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.signal.aborted) return reject(this.signal.reason);
      const onAbort = (): void => {
        clearTimeout(timer);
        reject(this.signal.reason);
      };
      const timer = setTimeout(() => {
        this.signal.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      this.signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** The events of `source`, with its failures as `failure` makes them. */
  async *guard(source: AsyncGenerator<SseEvent>): AsyncGenerator<SseEvent> {
    for (;;) {
      let next: IteratorResult<SseEvent>;
      try {
        next = await source.next();
      } catch (e) {
        const failure = this.failure(e);
        if (failure instanceof TransportError && !(failure instanceof ClientTimeoutError) && !this.signal.aborted) {
          throw new TransportError(`the connection was lost mid-stream: ${failure.message}`, {
            code: "transport_error",
            cause: e,
          });
        }
        throw failure;
      }
      if (next.done) return;
      let resumed = false;
      try {
        yield next.value;
        resumed = true;
      } finally {
        // A consumer that stops early (a `break`) lands here: the source is closed too.
        if (!resumed) await source.return(undefined).catch(() => undefined);
      }
    }
  }
}

function tooLarge(limit: number, response: Response): ProtocolError {
  return new ProtocolError(`the answer is over the client's limit of ${limit} bytes`, {
    code: "protocol_error",
    status: response.status,
    requestId: response.headers.get("x-request-id") ?? undefined,
  });
}

function mediaType(headers: Headers): string {
  return (headers.get("content-type") ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
}

function utf8(bytes: Uint8Array, fatal = true): string {
  try {
    return new TextDecoder("utf-8", { fatal }).decode(bytes);
  } catch {
    throw new ProtocolError("the answer is not UTF-8", { code: "protocol_error", status: 200 });
  }
}

function causeText(e: Error): string {
  const cause: unknown = e.cause;
  if (cause instanceof Error) return ` (${cause.message})`;
  return "";
}

function nonNegative(n: number, what: string): number {
  if (!Number.isFinite(n) || n < 0) throw new RangeError(`${what} must be a number >= 0`);
  return n;
}

function positive(n: number, what: string): number {
  if (!Number.isFinite(n) || n <= 0) throw new RangeError(`${what} must be a number > 0`);
  return n;
}
