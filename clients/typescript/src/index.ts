// The package's public surface: everything a user imports comes from here.
export const VERSION = "0.1.0";

// Exact values: an execution's result decoded (decode.ts, values.ts) from JSON that keeps
// big integers exact (json.ts).
export { decode, DecodeError, type DecodeOptions } from "./decode.js";
export { parseJson } from "./json.js";
export {
  Complex,
  DataFrame,
  Decimal,
  kindOf,
  NDArray,
  PyDate,
  PyDateTime,
  PySet,
  PyTime,
  Repr,
  Series,
  Timedelta,
  type JsonObject,
  type NDArrayData,
  type Value,
  type ValueKind,
} from "./values.js";

export { Airlock, DEFAULT_URL, type AirlockOptions } from "./client.js";
export type { Files, RunOptions, StreamOptions } from "./request.js";
export * from "./errors.js";
export {
  DEFAULTS,
  Transport,
  filePath,
  segment,
  type Answer,
  type ApiRequest,
  type BodyKind,
  type CallOptions,
  type EventStream,
  type Fetch,
  type TransportOptions,
} from "./http.js";
export { readEvents, SseParser, type SseEvent, type SseOptions } from "./sse.js";
export { ExecutionStream, parseStreamEvent, type OnApproval } from "./stream.js";
export type * from "./types.js";
export {
  BackgroundEvents,
  BackgroundExecution,
  BackgroundNotFinishedError,
  WaitTimeoutError,
  type BackgroundEvent,
  type BackgroundFailure,
  type BackgroundInfo,
  type BackgroundState,
  type EventsOptions,
  type WaitOptions,
} from "./background.js";
export { Environments, type BuiltEnvironment, type EnvironmentInfo } from "./environments.js";
export type { FileData } from "./files.js";
export {
  Session,
  type CellExecution,
  type CellOptions,
  type CellStreamOptions,
  type FileEntry,
  type SessionInfo,
  type SessionOptions,
  type SnapshotInfo,
} from "./sessions.js";
export { Volume, Volumes, type CreateVolumeOptions, type VolumeFileEntry, type VolumeFiles, type VolumeInfo } from "./volumes.js";
