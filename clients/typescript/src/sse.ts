// A reader of server-sent events (the WHATWG "event stream" format) over any stream of bytes:
// chunks split anywhere (inside a line, a CRLF, a UTF-8 character), lines ended by CRLF, LF
// or CR, comments, multi-line `data`, `id` (kept across events, as `Last-Event-ID` resumes)
// and `retry`. Bounded: one event may hold at most `maxEventChars` characters.

import { ProtocolError, printable } from "./errors.js";

/** One event of a stream. */
export interface SseEvent {
  /** The `event:` field, or `"message"` when there was none. */
  event: string;
  /** The `data:` lines, joined by `\n`. */
  data: string;
  /** The last `id:` seen, in this event or an earlier one (what `Last-Event-ID` resumes
   * after); undefined when none was sent yet. */
  id: string | undefined;
  /** The `retry:` the stream asked for (ms), when this event or an earlier one gave one. */
  retry: number | undefined;
}

/** Options of `readEvents`. */
export interface SseOptions {
  /** The most characters one event (its lines, comments included) may take; 64 Mi by default. */
  maxEventChars?: number;
  /** The most bytes the whole stream may take; unbounded by default. */
  maxStreamBytes?: number;
  /** Refuse a field other than `event`, `data`, `id` and `retry` (the format skips them): a
   * stream of a server that sends none. */
  strict?: boolean;
}

const DEFAULT_MAX_EVENT_CHARS = 64 << 20;

/** The events of `body` as they are completed; an event cut off by the stream's end is not
 * dispatched (the caller decides whether the stream ended where it should). Errors of the
 * underlying stream are thrown as they are; the reader is released in every case. */
export async function* readEvents(
  body: ReadableStream<Uint8Array>,
  options: SseOptions = {},
): AsyncGenerator<SseEvent, void, undefined> {
  const parser = new SseParser(options.maxEventChars ?? DEFAULT_MAX_EVENT_CHARS, options.strict);
  const maxStreamBytes = options.maxStreamBytes ?? Infinity;
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8", { fatal: true });
  let size = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      size += value?.byteLength ?? 0;
      if (size > maxStreamBytes) {
        throw new ProtocolError(`the stream is over the client's limit of ${maxStreamBytes} bytes`, {
          code: "protocol_error",
          status: 200,
        });
      }
      let text: string;
      try {
        text = done ? decoder.decode() : decoder.decode(value, { stream: true });
      } catch {
        throw new ProtocolError("an event stream that is not UTF-8", { code: "protocol_error", status: 200 });
      }
      yield* parser.feed(text);
      if (done) return;
    }
  } finally {
    // Cancels the body when the consumer stops early (a `break`), and frees it either way.
    await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

/** The line-level parser: text in, completed events out. Exported for tests of its edges. */
export class SseParser {
  private buffer = "";
  private afterCR = false;
  private event = "";
  private data: string[] = [];
  private hasData = false;
  private eventChars = 0;
  private lastId: string | undefined;
  private retry: number | undefined;

  constructor(
    private readonly maxEventChars: number = DEFAULT_MAX_EVENT_CHARS,
    private readonly strict = false,
  ) {}

  /** The events that `text` completes. */
  feed(text: string): SseEvent[] {
    const out: SseEvent[] = [];
    let start = 0;
    let i = 0;
    if (this.afterCR && text.startsWith("\n")) {
      // The LF of a CRLF split between two chunks.
      start = i = 1;
    }
    this.afterCR = false;
    for (; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      const event = this.line(this.buffer + text.slice(start, i));
      this.buffer = "";
      if (event) out.push(event);
      if (c === 13) {
        if (i + 1 === text.length) this.afterCR = true;
        else if (text.charCodeAt(i + 1) === 10) i++;
      }
      start = i + 1;
    }
    this.buffer += text.slice(start);
    this.check(this.buffer.length);
    return out;
  }

  private check(pending: number): void {
    if (this.eventChars + pending > this.maxEventChars) {
      throw new ProtocolError(`an event over the client's limit of ${this.maxEventChars} characters`, {
        code: "protocol_error",
        status: 200,
      });
    }
  }

  private line(line: string): SseEvent | undefined {
    if (line === "") return this.dispatch();
    this.eventChars += line.length + 1;
    this.check(0);
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (name) {
      case "event":
        this.event = value;
        break;
      case "data":
        this.data.push(value);
        this.hasData = true;
        break;
      case "id":
        if (!value.includes("\0")) this.lastId = value;
        break;
      case "retry":
        if (/^[0-9]+$/.test(value)) this.retry = Number(value);
        break;
      default:
        // Unknown fields are ignored, as the format says, unless the stream has none.
        if (this.strict) {
          throw new ProtocolError(`an unknown event field ${JSON.stringify(printable(name, 40))}`, {
            code: "protocol_error",
            status: 200,
          });
        }
        break;
    }
    return undefined;
  }

  private dispatch(): SseEvent | undefined {
    const event: SseEvent | undefined = this.hasData
      ? { event: this.event || "message", data: this.data.join("\n"), id: this.lastId, retry: this.retry }
      : undefined;
    this.event = "";
    this.data = [];
    this.hasData = false;
    this.eventChars = 0;
    return event;
  }
}
