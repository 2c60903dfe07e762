// The package's public surface: everything a user imports comes from here.
export const VERSION = "0.1.0";

export { Airlock, DEFAULT_URL, type AirlockOptions, type Files, type RunOptions, type StreamOptions } from "./client.js";
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
