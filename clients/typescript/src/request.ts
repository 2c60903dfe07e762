// What an execution is given besides its code, and the body of the request that runs it: shared
// by runs, streams, sessions' cells and background executions.

import type { CallOptions } from "./http.js";
import type { OnApproval } from "./stream.js";
import type { EgressPolicy, ExecuteRequest, InputFile, Limits, VolumeMount } from "./types.js";

/** Files placed in the working directory before the code runs: a path each, with text
 * (written as UTF-8) or bytes; or the API's own list. */
export type Files = Record<string, string | Uint8Array> | readonly InputFile[];

/** What an execution may be given besides its code; the API's own fields keep its names. */
export interface RunOptions extends CallOptions {
  /** Limits (`timeout_ms`, `memory_mb`, `cpu_ms`, `pids`, `disk_mb`, `output_bytes`), each
   * within the key's ceiling. */
  limits?: Limits | undefined;
  files?: Files | undefined;
  /** Environment variables; nothing of the server's own is passed. */
  env?: Record<string, string> | undefined;
  /** The program's standard input. */
  stdin?: string | undefined;
  /** A named environment whose packages are importable. */
  environment?: string | undefined;
  /** Hosts the code may reach, narrowing the key's egress policy. */
  egress?: EgressPolicy | undefined;
  /** The key's credentials the proxy may use (names; `[]` for none; all when absent). */
  credentials?: readonly string[] | undefined;
  /** Volumes of this key's to mount below `/work` or `/tmp`. */
  volumes?: readonly VolumeMount[] | undefined;
  /** Function mode: the function to call after the code ran as a module... */
  entrypoint?: string | undefined;
  /** ...with these keyword arguments (plain JSON data). */
  inputs?: Record<string, unknown> | undefined;
}

/** What a stream takes besides `run`'s options. */
export interface StreamOptions extends RunOptions {
  /** Called with each of the code's tool calls that waits for an approval, as it is read. */
  onApproval?: OnApproval | undefined;
}

/** The body of `POST /v1/execute` (and `/v1/executions`) for `code` and its options. */
export function executeBody(code: string, options: RunOptions): ExecuteRequest {
  if (typeof code !== "string") throw new TypeError("code is a string");
  const body: ExecuteRequest = { code };
  if (options.limits !== undefined) body.limits = options.limits;
  if (options.files !== undefined) body.files = inputFiles(options.files);
  if (options.env !== undefined) body.env = options.env;
  if (options.stdin !== undefined) body.stdin = options.stdin;
  if (options.environment !== undefined) body.environment = options.environment;
  if (options.egress !== undefined) body.egress = { hosts: [], ranges: [], ...options.egress };
  if (options.credentials !== undefined) {
    if (typeof options.credentials === "string") throw new TypeError('credentials is a list of names: ["github"]');
    body.credentials = [...options.credentials];
  }
  if (options.volumes !== undefined) body.volumes = options.volumes.map((v) => ({ read_only: false, ...v }));
  if (options.entrypoint !== undefined) {
    body.entrypoint = options.entrypoint;
    body.inputs = (options.inputs ?? {}) as NonNullable<ExecuteRequest["inputs"]>;
  } else if (options.inputs !== undefined) {
    throw new TypeError("inputs are the keyword arguments of an entrypoint: name one");
  }
  return body;
}

/** `files` as the API takes them: text as UTF-8, bytes as base64. */
export function inputFiles(files: Files): NonNullable<ExecuteRequest["files"]> {
  if (Array.isArray(files)) return [...(files as readonly InputFile[])].map((f) => ({ encoding: "utf8" as const, ...f }));
  return Object.entries(files as Record<string, string | Uint8Array>).map(([path, content]) =>
    typeof content === "string"
      ? { path, content, encoding: "utf8" as const }
      : { path, content: base64(content), encoding: "base64" as const },
  );
}

/** Bytes as base64, with only what every runtime has (`btoa`). */
export function base64(bytes: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}
