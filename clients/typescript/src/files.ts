// Files in and out of a session's working directory or a volume: what an upload takes, and
// the three ways a download gives it (whole, as a stream, listed).

import { filePath, type ApiRequest, type CallOptions, type Transport } from "./http.js";
import { object } from "./results.js";
import { ProtocolError } from "./errors.js";

/** What an upload takes: bytes, text (written as UTF-8), a `Blob`, or a stream of bytes (sent
 * as it is read; such an upload is never retried). */
export type FileData = Uint8Array | string | Blob | ReadableStream<Uint8Array>;

/** A place that holds files (a session's working directory, a volume): they go in and out
 * here without a sandbox. */
export abstract class FileHolder {
  readonly #transport: Transport;
  readonly #base: string;

  /** Files below `base` (a route's path, its segments encoded). */
  protected constructor(transport: Transport, base: string) {
    this.#transport = transport;
    this.#base = base;
  }

  /** Writes a file whole: bytes, text (as UTF-8), a `Blob` or a `ReadableStream`; missing
   * directories are made. `path` is relative, without `..`, `.` or empty parts. */
  async upload(path: string, data: FileData, options: CallOptions = {}): Promise<void> {
    if (!isFileData(data)) throw new TypeError("a file's data is a Uint8Array, a string, a Blob or a ReadableStream");
    const req: ApiRequest = { method: "PUT", path: this.#file(path), body: data, ok: [204] };
    await this.#transport.request(req, "none", options);
  }

  /** A regular file's bytes, whole (a link is refused, never followed; a missing file is a
   * `NotFoundError`). */
  async download(path: string, options: CallOptions = {}): Promise<Uint8Array> {
    const answer = await this.#transport.request({ method: "GET", path: this.#file(path) }, "bytes", options);
    return answer.body;
  }

  /** As `download`, as a stream of its bytes, read as the caller reads it. */
  async downloadStream(path: string, options: CallOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const answer = await this.#transport.stream({ method: "GET", path: this.#file(path) }, options);
    return answer.body;
  }

  /** Removes the file, link or empty directory at `path` (volumes only). */
  protected async removeFile(path: string, options: CallOptions): Promise<void> {
    await this.#transport.request({ method: "DELETE", path: this.#file(path), ok: [204] }, "none", options);
  }

  /** The listing's body (`{"files": [...], ...}`), its `files` checked to be an array. */
  protected async listFiles(options: CallOptions): Promise<Record<string, unknown> & { files: unknown[] }> {
    const answer = await this.#transport.request({ method: "GET", path: `${this.#base}/files` }, "json", options);
    const body = object(answer.body, "$");
    return { ...body, files: array(body["files"], "$.files") };
  }

  #file(path: string): string {
    return `${this.#base}/files/${filePath(path)}`;
  }
}

function isFileData(data: unknown): data is FileData {
  return (
    typeof data === "string" ||
    data instanceof Uint8Array ||
    (typeof Blob !== "undefined" && data instanceof Blob) ||
    (typeof ReadableStream !== "undefined" && data instanceof ReadableStream)
  );
}

/** `value` as an array, or a ProtocolError naming `where`. */
export function array(value: unknown, where: string): unknown[] {
  if (!Array.isArray(value)) expected(where, "an array");
  return value;
}

/** Throws the ProtocolError of an answer whose `where` is not `what`. */
export function expected(where: string, what: string): never {
  throw new ProtocolError(`${where}: expected ${what}`, { code: "protocol_error", status: 200 });
}
