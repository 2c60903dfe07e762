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
