// The errors the client throws. Every refusal of the server is an `AirlockError` subclass
// chosen by its stable `code` (docs/http-api.md, "Errors"), so `instanceof` tells them apart;
// what the client itself detects (a lost connection, an answer airlock would never send, an
// execution that did not end `ok` where a value was asked for) has a class of its own too.

/** The fields every `AirlockError` carries besides its message. */
export interface AirlockErrorInit {
  /** airlock's stable code (`invalid_request`, `rate_limited`, ...), or the client's own. */
  code: string;
  /** The HTTP status of the answer; 0 when there was none (a network failure). */
  status?: number;
  /** The server's request id (`X-Request-Id`), as its log and audit lines name it. */
  requestId?: string | undefined;
  /** The request field at fault, as a path such as `files[2].path`. */
  field?: string | undefined;
  /** How long the server asked to wait before trying again (`Retry-After`), in ms. */
  retryAfterMs?: number | undefined;
  /** The error this one stands for (a `fetch` failure). */
  cause?: unknown;
}

/** Everything the client throws on purpose derives from this. */
export class AirlockError extends Error {
  override name = "AirlockError";
  /** airlock's stable code, or the client's own (`transport_error`, `protocol_error`, ...). */
  readonly code: string;
  /** The HTTP status of the answer; 0 when there was none. */
  readonly status: number;
  /** The server's request id (`X-Request-Id`), when an answer came. */
  readonly requestId: string | undefined;
  /** The request field at fault, as a path such as `files[2].path`. */
  readonly field: string | undefined;
  /** `Retry-After` in milliseconds, when the server said when to come back. */
  readonly retryAfterMs: number | undefined;

  constructor(message: string, init: AirlockErrorInit) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.code = init.code;
    this.status = init.status ?? 0;
    this.requestId = init.requestId;
    this.field = init.field;
    this.retryAfterMs = init.retryAfterMs;
  }
}

/** The server could not be reached, or the connection failed mid-request or mid-stream. The
 * request may or may not have run. */
export class TransportError extends AirlockError {
  override name = "TransportError";
}

/** The call's own `timeoutMs` passed before its answer was whole (its request was aborted,
 * which stops an execution the server was running for it). */
export class ClientTimeoutError extends TransportError {
  override name = "ClientTimeoutError";
}

/** An answer that is not what airlock sends: a proxy's HTML page, a wrong content type,
 * malformed JSON, a stream that ends before its result, an answer over the client's limit.
 * Nothing in it was used. */
export class ProtocolError extends AirlockError {
  override name = "ProtocolError";
}

/** An execution that did not end `ok` where its value was asked for (`call()`); the whole
 * execution is attached. */
export class ExecutionFailedError extends AirlockError {
  override name = "ExecutionFailedError";
  /** The execution as the server answered it. */
  readonly execution: unknown;
  constructor(message: string, execution: unknown, requestId?: string) {
    super(message, { code: "execution_failed", status: 200, requestId });
    this.execution = execution;
  }
}

// One class per code the server sends (the `code` of `{"error": {...}}`). A code shared by
// a status family derives from the family's class, so `instanceof ConflictError` holds for
// every 409.

/** 400: the request is malformed or has a value out of range; `field` names it. */
export class BadRequestError extends AirlockError {
  override name = "BadRequestError";
}
/** 400 `invalid_json`: the body is not JSON. */
export class InvalidJsonError extends BadRequestError {
  override name = "InvalidJsonError";
}
/** 400 `invalid_request`: an unknown field, a wrong type, an invalid value (`field`). */
export class InvalidRequestError extends BadRequestError {
  override name = "InvalidRequestError";
}
/** 400 `limit_above_ceiling`: a limit above the key's ceiling (`field`). */
export class LimitAboveCeilingError extends BadRequestError {
  override name = "LimitAboveCeilingError";
}
/** 401 `unauthorized`: no key, or one the server does not know (`invalidToken`). */
export class UnauthorizedError extends AirlockError {
  override name = "UnauthorizedError";
  /** A key was presented and is not valid (`WWW-Authenticate: ... error="invalid_token"`). */
  invalidToken = false;
}
/** 403 `forbidden`: the key lacks the route's scope, or a credential it names. */
export class ForbiddenError extends AirlockError {
  override name = "ForbiddenError";
}
/** 404 `not_found`: no such execution, session, approval, environment, volume or file for
 * this key. */
export class NotFoundError extends AirlockError {
  override name = "NotFoundError";
}
/** 405 `method_not_allowed`. */
export class MethodNotAllowedError extends AirlockError {
  override name = "MethodNotAllowedError";
}
/** 406 `not_acceptable` (`/mcp` only): the request does not accept what the route answers. */
export class NotAcceptableError extends AirlockError {
  override name = "NotAcceptableError";
}
/** 408 `timeout`: the request's body did not arrive in time. */
export class RequestTimeoutError extends AirlockError {
  override name = "RequestTimeoutError";
}
/** 409 `conflict`, and the family of every 409: what the request names is busy or in a state
 * that refuses it. */
export class ConflictError extends AirlockError {
  override name = "ConflictError";
}
/** 409 `session_busy`: another request of the session is running. */
export class SessionBusyError extends ConflictError {
  override name = "SessionBusyError";
}
/** 409 `session_ended`: a cell ended the session. */
export class SessionEndedError extends ConflictError {
  override name = "SessionEndedError";
}
/** `cancelled`: a background execution was cancelled (the `error` event of its stream). */
export class CancelledError extends ConflictError {
  override name = "CancelledError";
}
/** 409 `volume_busy`: another writer holds the volume; the message names it. */
export class VolumeBusyError extends ConflictError {
  override name = "VolumeBusyError";
}
/** 409 `volume_in_use`: the volume cannot be deleted while held; the message names holders. */
export class VolumeInUseError extends ConflictError {
  override name = "VolumeInUseError";
}
/** 410 `session_lost`: the session was open when the server stopped. */
export class SessionLostError extends AirlockError {
  override name = "SessionLostError";
}
/** 413 `payload_too_large`, and the family of every 413: a body, code, files or inputs over
 * the server's limits. */
export class PayloadTooLargeError extends AirlockError {
  override name = "PayloadTooLargeError";
}
/** 413 `volume_full`: the upload does not fit in the volume; nothing of it was left. */
export class VolumeFullError extends PayloadTooLargeError {
  override name = "VolumeFullError";
}
/** 413 `quota_exceeded`: a new volume or a pause's snapshot would pass the key's quota. */
export class QuotaExceededError extends PayloadTooLargeError {
  override name = "QuotaExceededError";
}
/** `storage_full`: a background execution passed what its key may store (its `error` event). */
export class StorageFullError extends PayloadTooLargeError {
  override name = "StorageFullError";
}
/** 415 `unsupported_media_type`: the body is not of a type the route takes. */
export class UnsupportedMediaTypeError extends AirlockError {
  override name = "UnsupportedMediaTypeError";
}
/** 421 `misdirected_request`: the Host header names no address this server answers for. */
export class MisdirectedRequestError extends AirlockError {
  override name = "MisdirectedRequestError";
}
/** 422, the family: well formed, and what it asked for failed. */
export class UnprocessableError extends AirlockError {
  override name = "UnprocessableError";
}
/** 422 `build_failed`: an environment's packages did not install. */
export class BuildFailedError extends UnprocessableError {
  override name = "BuildFailedError";
}
/** 422 `volumes_unavailable`: this server cannot make or mount volumes. */
export class VolumesUnavailableError extends UnprocessableError {
  override name = "VolumesUnavailableError";
}
/** 422 `snapshot_failed`: the session's sandbox could not take or read its snapshot. */
export class SnapshotFailedError extends UnprocessableError {
  override name = "SnapshotFailedError";
}
/** 422 `snapshot_invalid`: a paused session's snapshot was altered or is not this session's. */
export class SnapshotInvalidError extends UnprocessableError {
  override name = "SnapshotInvalidError";
}
/** 422 `snapshots_unavailable`: this server cannot pause sessions. */
export class SnapshotsUnavailableError extends UnprocessableError {
  override name = "SnapshotsUnavailableError";
}
/** 429 `rate_limited`: the key's rate, concurrency, sessions or memory share is used up;
 * `retryAfterMs` says when to come back, when waiting is what helps. */
export class RateLimitedError extends AirlockError {
  override name = "RateLimitedError";
}
/** 500 `internal`: airlock itself failed. */
export class InternalError extends AirlockError {
  override name = "InternalError";
}
/** 503, the family: the server cannot take the request now; `retryAfterMs` says when. */
export class ServiceUnavailableError extends AirlockError {
  override name = "ServiceUnavailableError";
}
/** 503 `overloaded`: every slot and the queue, or the memory for answers, is taken. */
export class OverloadedError extends ServiceUnavailableError {
  override name = "OverloadedError";
}
/** 503 `shutting_down`: the server is stopping (`Retry-After: 5`). */
export class ShuttingDownError extends ServiceUnavailableError {
  override name = "ShuttingDownError";
}
/** 503 `unavailable`: sandboxes cannot start, or the audit log or store cannot be written. */
export class UnavailableError extends ServiceUnavailableError {
  override name = "UnavailableError";
}
/** 503 `interrupted`: the server stopped while the execution waited or ran. */
export class InterruptedError extends ServiceUnavailableError {
  override name = "InterruptedError";
}

type ErrorClass = new (message: string, init: AirlockErrorInit) => AirlockError;

/** Each code the server sends, with its class and the status it comes with (a stream's
 * `error` event, sent within a 200, stands for that status). */
export const ERROR_CODES: Readonly<Record<string, readonly [ErrorClass, number]>> = Object.freeze({
  invalid_json: [InvalidJsonError, 400],
  invalid_request: [InvalidRequestError, 400],
  limit_above_ceiling: [LimitAboveCeilingError, 400],
  unauthorized: [UnauthorizedError, 401],
  forbidden: [ForbiddenError, 403],
  not_found: [NotFoundError, 404],
  method_not_allowed: [MethodNotAllowedError, 405],
  not_acceptable: [NotAcceptableError, 406],
  timeout: [RequestTimeoutError, 408],
  conflict: [ConflictError, 409],
  session_busy: [SessionBusyError, 409],
  session_ended: [SessionEndedError, 409],
  cancelled: [CancelledError, 409],
  volume_busy: [VolumeBusyError, 409],
  volume_in_use: [VolumeInUseError, 409],
  session_lost: [SessionLostError, 410],
  payload_too_large: [PayloadTooLargeError, 413],
  volume_full: [VolumeFullError, 413],
  quota_exceeded: [QuotaExceededError, 413],
  storage_full: [StorageFullError, 413],
  unsupported_media_type: [UnsupportedMediaTypeError, 415],
  misdirected_request: [MisdirectedRequestError, 421],
  build_failed: [BuildFailedError, 422],
  volumes_unavailable: [VolumesUnavailableError, 422],
  snapshot_failed: [SnapshotFailedError, 422],
  snapshot_invalid: [SnapshotInvalidError, 422],
  snapshots_unavailable: [SnapshotsUnavailableError, 422],
  rate_limited: [RateLimitedError, 429],
  internal: [InternalError, 500],
  overloaded: [OverloadedError, 503],
  shutting_down: [ShuttingDownError, 503],
  unavailable: [UnavailableError, 503],
  interrupted: [InterruptedError, 503],
});

// The most of a server's text an error message quotes.
const MESSAGE_MAX = 2000;
const QUOTE_MAX = 200;

/** A server's text as a message may show it: control characters (a terminal's commands) as
 * spaces, and bounded. */
export function printable(text: string, most: number = MESSAGE_MAX): string {
  // eslint-disable-next-line no-control-regex
  const clean = text.slice(0, most + 1).replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g, " ");
  return clean.length > most ? clean.slice(0, most) + "…" : clean;
}

/** What an error answer says, read from its status, headers and body text. */
export interface ErrorAnswer {
  status: number;
  headers: Headers;
  body: string;
}

/** `Retry-After` in milliseconds: a number of seconds, or an HTTP date (from now); undefined
 * when absent or unreadable. */
export function retryAfterMs(value: string | null, now: number = Date.now()): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  if (/^[0-9]{1,9}$/.test(text)) return Number(text) * 1000;
  if (!/[a-z]/i.test(text)) return undefined;
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/** The error an answer of airlock's error shape (`{"error": {"code", "message", "field",
 * "request_id"}}`) stands for; an answer that is not in that shape (a proxy's HTML page)
 * is a `ProtocolError` quoting the start of it. */
export function errorFromAnswer(answer: ErrorAnswer): AirlockError {
  const requestId = answer.headers.get("x-request-id") ?? undefined;
  const retryAfter = retryAfterMs(answer.headers.get("retry-after"));
  const media = (answer.headers.get("content-type") ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
  const parsed = media === "application/json" ? errorBody(answer.body) : undefined;
  if (parsed === undefined) {
    const quoted = printable(answer.body.trim(), QUOTE_MAX);
    const what = media === "" ? "no content type" : media;
    return new ProtocolError(
      `HTTP ${answer.status} with a body that is not airlock's error (${what})` + (quoted ? `: ${quoted}` : ""),
      { code: "protocol_error", status: answer.status, requestId, retryAfterMs: retryAfter },
    );
  }
  const error = errorFor(parsed.code, parsed.message, {
    status: answer.status,
    requestId: parsed.requestId ?? requestId,
    field: parsed.field,
    retryAfterMs: retryAfter,
  });
  if (error instanceof UnauthorizedError) {
    error.invalidToken = /error\s*=\s*"?invalid_token/i.test(answer.headers.get("www-authenticate") ?? "");
  }
  return error;
}

/** The error for one of airlock's codes: its class (an unknown code is an `AirlockError`
 * that keeps it), with `init.status` or else the code's own status. */
export function errorFor(
  code: string,
  message: string,
  init: Omit<AirlockErrorInit, "code"> = {},
): AirlockError {
  const known = Object.hasOwn(ERROR_CODES, code) ? ERROR_CODES[code] : undefined;
  const Class = known?.[0] ?? AirlockError;
  const status = init.status ?? known?.[1] ?? 0;
  const where = init.field ? ` (field ${init.field})` : "";
  return new Class(`${status} ${code}: ${message}${where}`, { ...init, code, status });
}

interface ParsedError {
  code: string;
  message: string;
  field: string | undefined;
  requestId: string | undefined;
}

/** The `error` object of an error body, or undefined when the text is not one. */
export function errorBody(text: string): ParsedError | undefined {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  const error = isObject(value) ? value["error"] : undefined;
  if (!isObject(error) || typeof error["code"] !== "string") return undefined;
  const field = error["field"];
  const requestId = error["request_id"];
  return {
    code: printable(error["code"], 64),
    message: printable(typeof error["message"] === "string" ? error["message"] : ""),
    field: typeof field === "string" ? printable(field, 200) : undefined,
    requestId: typeof requestId === "string" ? printable(requestId, 100) : undefined,
  };
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
