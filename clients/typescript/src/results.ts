// Answers read into the client's types: checked for the fields the client relies on (an
// answer without them is a ProtocolError, not a crash later), and results decoded.

import { ProtocolError } from "./errors.js";
import type { Evaluation, Execution, ResultValue } from "./types.js";

/** The value a result form stands for. The one place results are decoded. */
export function decodeResult(raw: ResultValue | null): unknown {
  return raw;
}

/** `value` as an object, or a ProtocolError naming `where`. */
export function object(value: unknown, where: string): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ProtocolError(`${where}: expected an object, got ${value === null ? "null" : Array.isArray(value) ? "an array" : typeof value}`, {
      code: "protocol_error",
      status: 200,
    });
  }
  return value as Record<string, unknown>;
}

function expect(ok: boolean, where: string, what: string): void {
  if (!ok) throw new ProtocolError(`${where}: expected ${what}`, { code: "protocol_error", status: 200 });
}

/** An execution's answer (or a stream's `result` event) as an `Execution`. */
export function toExecution(value: unknown, requestId: string | undefined, where = "$"): Execution {
  const body = object(value, where);
  expect(typeof body["status"] === "string", `${where}.status`, "a string");
  expect(typeof body["stdout"] === "string" && typeof body["stderr"] === "string", `${where}.stdout`, "strings stdout and stderr");
  const raw = (body["result"] ?? null) as ResultValue | null;
  const outputs = body["outputs"] ?? [];
  const files = body["files"] ?? [];
  expect(Array.isArray(outputs), `${where}.outputs`, "an array");
  expect(Array.isArray(files), `${where}.files`, "an array");
  return {
    ...(body as unknown as Omit<Execution, "result" | "resultJson" | "ok" | "requestId">),
    outputs: outputs as Execution["outputs"],
    files: files as Execution["files"],
    result: decodeResult(raw),
    resultJson: raw,
    ok: body["status"] === "ok",
    requestId,
  };
}

/** The answer of `/v1/eval` as an `Evaluation`. */
export function toEvaluation(value: unknown): Evaluation {
  const body = object(value, "$");
  expect(typeof body["ok"] === "boolean", "$.ok", "a boolean");
  const raw = (body["value"] ?? null) as ResultValue | null;
  return {
    ...(body as unknown as Omit<Evaluation, "value" | "valueJson">),
    value: body["ok"] === true && "value" in body && body["value"] !== undefined ? decodeResult(raw) : undefined,
    valueJson: raw,
  };
}
