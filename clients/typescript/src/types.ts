// The requests and answers of the API, derived from the types generated from the served
// OpenAPI document (openapi.gen.ts), so that they cannot drift from the server. The API's own
// fields keep the API's names (`timeout_ms`, `exit_code`), so docs/http-api.md applies word
// for word; what the client adds is camelCase (`requestId`, `resultJson`).

import type { components } from "./openapi.gen.js";

type Schemas = components["schemas"];

/** How an execution ended: `ok`, `error`, `timeout`, `memory_limit`, `cpu_limit`,
 * `policy_violation`, `crashed` or `internal_error`. */
export type Status = Schemas["Status"];
/** A result as the server sends it: plain JSON, or a form marked `"$airlock"`. */
export type ResultValue = Schemas["ResultValue"];
/** Limits a caller asks for; anything left out takes the operator's default. */
export type Limits = Schemas["LimitsRequest"];
/** The limits an execution ran with. */
export type AppliedLimits = Schemas["Limits"];
/** Hosts and ranges the code may reach through airlock's proxy (never wider than the key's). */
export type EgressPolicy = Partial<Schemas["EgressPolicy"]>;
/** A file placed in the working directory before the code runs, as the API takes it. */
export type InputFile = Omit<Schemas["InputFile"], "encoding"> & Partial<Pick<Schemas["InputFile"], "encoding">>;
/** A volume an execution mounts: `{ name, path, read_only? }`. */
export type VolumeMount = Omit<Schemas["VolumeMountRequest"], "read_only"> &
  Partial<Pick<Schemas["VolumeMountRequest"], "read_only">>;
/** The body of `POST /v1/execute` (only `code` is required). */
export type ExecuteRequest = Pick<Schemas["ExecuteRequest"], "code"> & Partial<Omit<Schemas["ExecuteRequest"], "code">>;
/** The answer of `POST /v1/execute` as the server sends it. */
export type ExecuteResponse = Schemas["ExecuteResponse"];
/** An exception the program raised, or airlock's own failure. */
export type ErrorInfo = Schemas["ErrorInfo"];
/** A rich output (a chart, a `display()` call): `type` and `data`. */
export type Output = Schemas["Output"];
/** A file the code left in `./outputs`. */
export type OutputFile = Schemas["OutputFile"];
/** What an execution used. */
export type Usage = Schemas["Usage"];
/** An execution's audit record (`GET /v1/executions/{id}` of one that ran in place). */
export type ExecutionRecord = Schemas["ExecutionRecord"];
/** A tool call waiting for an approval, as `GET /v1/approvals` lists it. */
export type Approval = Schemas["Approval"];
/** One waiting call with its arguments whole (`GET /v1/approvals/{id}`). */
export type ApprovalDetail = Schemas["ApprovalDetail"];
/** The answer to a decision: the call as shown, what was decided and by whom. */
export type Decided = Schemas["Decided"];
/** The operator's tools this key's code may call, with their Python signatures. */
export type ToolList = Schemas["ToolsResponse"];
/** The body of an error answer. */
export type ErrorBody = Schemas["ErrorBody"];
/** A Python-style error of `/v1/eval`. */
export type EvalError = Schemas["EvalError"];

/** An execution's result: the server's answer, with the value of `result` decoded, the raw
 * form kept in `resultJson`, and for a streamed one its output put back together. */
export interface Execution extends Omit<ExecuteResponse, "result"> {
  /** The value of the code's final expression, or the entrypoint's return value, decoded. */
  result: unknown;
  /** `result` as the server sent it (JSON, with its `"$airlock"` forms). */
  resultJson: ResultValue | null;
  /** True when the output came as events of a stream (and was put back here). */
  output_streamed?: boolean;
  /** Whether it ended `ok`. */
  ok: boolean;
  /** The server's id of the request (`X-Request-Id`). */
  requestId: string | undefined;
}

/** The answer of `eval()`: `ok` with the value, or not, with the error. */
export interface Evaluation extends Omit<Schemas["EvalResponse"], "value"> {
  /** The value, decoded; undefined when JSON cannot hold it exactly (see `repr`). */
  value: unknown;
  /** The value as the server sent it, or null. */
  valueJson: ResultValue | null;
}

/** One event of a streamed execution, told apart by `type`. */
export type StreamEvent =
  /** Output the program wrote, as it wrote it. */
  | { type: "stdout" | "stderr"; text: string }
  /** A stream reached `output_bytes`; the rest of it is dropped. */
  | { type: "truncated"; stream: "stdout" | "stderr"; limit: number }
  /** One of the code's tool calls waits for an approval (another key decides it). */
  | { type: "approval"; approval: Approval }
  /** A rich output (a chart, `display()`): the server sends them with the result, each
   * one comes as an event just before it. */
  | { type: "display"; output: Output }
  /** The execution's result, last. */
  | { type: "result"; execution: Execution };
