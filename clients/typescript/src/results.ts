// Answers read into the client's types: checked for the fields the client relies on (an
// answer without them is a ProtocolError, not a crash later), and results decoded.

import { decode, isBase64 } from "./decode.js";
import { ExecutionFailedError, ProtocolError, printable } from "./errors.js";
import type { Value } from "./values.js";
import type { Evaluation, Execution, ResultValue, Status } from "./types.js";

/** The value a result form stands for, exactly (`decode`); a form airlock would not send is
 * a `DecodeError` (a `ProtocolError`) naming its path under `where`. The one place results
 * are decoded. */
export function decodeResult(raw: ResultValue | null, where: string): Value {
  return decode(raw, { where: [where] });
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

// How an execution may end (the `Status` of the API).
const STATUSES: ReadonlySet<string> = new Set<Status>([
  "ok",
  "error",
  "timeout",
  "memory_limit",
  "cpu_limit",
  "policy_violation",
  "crashed",
  "internal_error",
]);

type Kind = "string" | "boolean" | "integer" | "object" | "array";

/** Checks that `body[name]` is of `kind` (or null, with `nullable`); a missing one is an
 * error unless `optional`. */
function field(body: Record<string, unknown>, name: string, where: string, kind: Kind, nullable = false, optional = false): void {
  const value = body[name];
  const here = `${where}.${name}`;
  if (value === undefined) {
    if (optional || nullable) return;
    throw new ProtocolError(`${here}: missing`, { code: "protocol_error", status: 200 });
  }
  if (value === null && nullable) return;
  const ok =
    kind === "integer"
      ? Number.isSafeInteger(value)
      : kind === "object"
        ? typeof value === "object" && value !== null && !Array.isArray(value)
        : kind === "array"
          ? Array.isArray(value)
          : typeof value === kind;
  expect(ok, here, kind === "integer" || kind === "object" || kind === "array" ? `an ${kind}` : `a ${kind}`);
}

/** An execution's answer (or a stream's `result` event) as an `Execution`: every field the
 * API promises is checked to be there and of its type, so nothing later trusts a hostile
 * answer's shape. */
export function toExecution(value: unknown, requestId: string | undefined, where = "$"): Execution {
  const body = object(value, where);
  field(body, "status", where, "string");
  if (!STATUSES.has(body["status"] as string)) {
    throw new ProtocolError(`${where}.status: unknown status ${JSON.stringify(printable(body["status"] as string, 40))}`, {
      code: "protocol_error",
      status: 200,
    });
  }
  for (const name of ["exit_code", "signal"]) field(body, name, where, "integer", true);
  for (const name of ["stdout", "stderr"]) field(body, name, where, "string");
  for (const name of ["stdout_truncated", "stderr_truncated"]) field(body, name, where, "boolean");
  for (const name of ["output_streamed", "session_ended"]) field(body, name, where, "boolean", false, true);
  for (const name of ["usage", "limits", "isolation"]) field(body, name, where, "object");
  field(body, "limits_hit", where, "array");
  field(body, "error", where, "object", true);
  if (body["error"]) for (const name of ["type", "message"]) field(body["error"] as Record<string, unknown>, name, `${where}.error`, "string");
  const raw = (body["result"] ?? null) as ResultValue | null;
  const outputs = body["outputs"] ?? [];
  const files = body["files"] ?? [];
  expect(Array.isArray(outputs), `${where}.outputs`, "an array");
  expect(Array.isArray(files), `${where}.files`, "an array");
  (outputs as unknown[]).forEach((o, i) => object(o, `${where}.outputs[${i}]`));
  (files as unknown[]).forEach((f, i) => outputFile(f, `${where}.files[${i}]`));
  return {
    ...(body as unknown as Omit<Execution, "result" | "resultJson" | "ok" | "requestId">),
    outputs: outputs as Execution["outputs"],
    files: files as Execution["files"],
    result: decodeResult(raw, "result"),
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
    value: body["ok"] === true && "value" in body && body["value"] !== undefined ? decodeResult(raw, "value") : undefined,
    valueJson: raw,
  };
}

/** One of an execution's output files: a path, a size, its bytes as base64 (or null, when it
 * was skipped). */
function outputFile(value: unknown, where: string): void {
  const file = object(value, where);
  field(file, "path", where, "string");
  field(file, "size", where, "integer");
  field(file, "base64", where, "string", true);
  const data = file["base64"];
  if (typeof data === "string" && !isBase64(data)) {
    throw new ProtocolError(`${where}.base64: not base64`, { code: "protocol_error", status: 200 });
  }
}

/** The value of a function-mode execution, or the `ExecutionFailedError` of one that did not
 * end `ok`. */
export function valueOf(execution: Execution, entrypoint: string): Value {
  if (execution.ok) return execution.result;
  const why = execution.error ? `${execution.error.type}: ${execution.error.message}` : `exit code ${execution.exit_code ?? "none"}`;
  throw new ExecutionFailedError(`${entrypoint}() ended ${execution.status}: ${why}`, execution, execution.requestId);
}
