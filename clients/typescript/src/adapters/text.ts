/**
 * An execution as text for a model to read: what the code printed, its result, the error with
 * its traceback, why it stopped when it did not end well, and what was cut. Bounded: a model's
 * context is small, and a program can print megabytes. Charts and files are named, never
 * inlined: their bytes stay with the program (an adapter's `onExecution`), unless the tool
 * was asked to hand charts to the model as images ({@link pickImages}).
 *
 * The same rules and bounds as the Python client's adapters, so a model reads the same text
 * from either.
 */

import type { ExecutionLike } from "./sandbox.js";

/** What the model is told of a tool that runs each call in a fresh sandbox. */
export const ONE_SHOT_DESCRIPTION =
  "Runs Python 3 code in a fresh, isolated sandbox and returns what it printed, the value of " +
  "its last expression (as `result:`) and any error with its traceback. Nothing is kept " +
  "between calls. No network unless the operator allowed it. Use print() for anything else " +
  "you want to see.";

/** What the model is told of a tool that keeps one session between calls. */
export const SESSION_DESCRIPTION =
  "A Python 3 shell in an isolated sandbox that keeps its state between calls, like a " +
  "notebook: variables, imports and files persist. Returns what the code printed, the value " +
  "of its last expression (as `result:`) and any error with its traceback. No network unless " +
  "the operator allowed it. Use print() for anything else you want to see.";

/** What the model is told of the tools' one argument. */
export const CODE_DESCRIPTION = "The Python code to run.";

/**
 * Characters of a tool's answer at most: about 5000 tokens, what smolagents keeps of an
 * observation (its MAX_LENGTH_TRUNCATE_CONTENT is 20 000).
 */
export const DEFAULT_MAX_CHARS = 20_000;
// The least a long part keeps of itself when others crowd it.
const MIN_SHARE = 200;
// Rows of a DataFrame or Series shown.
const ROWS = 20;

const WHY: Record<string, (l: ExecutionLike["limits"]) => string> = {
  timeout: (l) => `it ran longer than its time limit (${l?.timeout_ms ?? "?"} ms) and was killed`,
  cpu_limit: (l) => `it used more than its CPU time limit (${l?.cpu_ms ?? "?"} ms) and was killed`,
  memory_limit: (l) => `it used more than its memory limit (${l?.memory_mb ?? "?"} MB) and was killed`,
  policy_violation: () => "the sandbox refused something it tried to do (a forbidden system call)",
  crashed: () => "the Python process crashed",
  internal_error: () => "the sandbox service failed; this is not the code's fault, try again",
};

/** Options of {@link render}. */
export interface RenderOptions {
  /** The most characters of text (default {@link DEFAULT_MAX_CHARS}). */
  maxChars?: number;
  /** A note put first, in brackets (a session tool says its session was replaced). */
  note?: string | undefined;
  /** The indices of the display outputs handed to the model as images ({@link pickImages}). */
  attached?: ReadonlySet<number> | undefined;
}

/** Images a tool's answer carries at most, by default. */
export const DEFAULT_MAX_IMAGES = 4;
/** The most bytes of one image a tool's answer carries, by default (1 MiB). */
export const DEFAULT_MAX_IMAGE_BYTES = 1_048_576;

/** A chart handed to a multimodal model beside a tool's text. */
export interface Image {
  /** Its media type (`image/png`). */
  readonly mediaType: string;
  /** Its bytes in base64, as the server sent them. */
  readonly data: string;
}

/** How many images a tool's answer carries at most, and how large each may be. */
export interface ImageBounds {
  /** Images at most (default {@link DEFAULT_MAX_IMAGES}); later ones are only named. */
  max?: number;
  /** Bytes of one image at most (default {@link DEFAULT_MAX_IMAGE_BYTES}); larger ones are only named. */
  maxBytes?: number;
}

/**
 * The execution's PNG display outputs (matplotlib figures, `display()`ed images) a model may
 * see, in order, within `bounds`, and their indices among the outputs (for {@link render},
 * which names the others).
 */
export function pickImages(execution: ExecutionLike, bounds: ImageBounds = {}): { images: Image[]; attached: Set<number> } {
  const max = bounds.max ?? DEFAULT_MAX_IMAGES;
  const maxBytes = bounds.maxBytes ?? DEFAULT_MAX_IMAGE_BYTES;
  const images: Image[] = [];
  const attached = new Set<number>();
  (execution.outputs ?? []).forEach((output, i) => {
    const { type, data } = output;
    if (type !== "image/png" || typeof data !== "string" || images.length >= max) return;
    if (base64Bytes(data) > maxBytes) return;
    images.push({ mediaType: type, data });
    attached.add(i);
  });
  return { images, attached };
}

// The bytes base64 text stands for, without decoding it.
function base64Bytes(data: string): number {
  const padding = data.endsWith("==") ? 2 : data.endsWith("=") ? 1 : 0;
  return Math.floor((data.length * 3) / 4) - padding;
}

/**
 * The execution as a model should read it: stdout, stderr, `result:` (the value of the last
 * expression as Python would print it), the error's traceback, `status:` with why when it did
 * not end ok, and bracketed notes for truncated output, charts and files. At most `maxChars`
 * characters: long parts keep their beginning and end.
 */
export function render(execution: ExecutionLike, options: RenderOptions = {}): string {
  const e = execution;
  const maxChars = options.maxChars ?? DEFAULT_MAX_CHARS;
  const head: string[] = [];
  if (options.note) head.push(`[${options.note}]`);
  if (e.status !== "ok") head.push(statusLine(e));

  const parts: [label: string, body: string][] = []; // the long parts that share the budget
  if (e.stdout) parts.push(["stdout:\n", trimNewlines(e.stdout)]);
  if (e.stderr) parts.push(["stderr:\n", trimNewlines(e.stderr)]);
  if (e.resultJson !== undefined && e.resultJson !== null) parts.push(["result: ", show(e.resultJson)]);
  if (e.error) {
    const trace = trimNewlines(e.error.traceback ?? "");
    const last = e.error.message ? `${e.error.type}: ${e.error.message}` : e.error.type;
    parts.push(["", trace || last]);
  }

  const tail: string[] = [];
  if (e.stdout_truncated) tail.push("[stdout was cut at the sandbox's output limit]");
  if (e.stderr_truncated) tail.push("[stderr was cut at the sandbox's output limit]");
  const attached = options.attached ?? new Set<number>();
  if (attached.size > 0) tail.push(`[${attached.size} chart(s) attached as image(s)]`);
  const outputs = (e.outputs ?? []).filter((_, i) => !attached.has(i));
  if (outputs.length > 0) {
    const kinds = [...new Set(outputs.map((o) => o.type))].sort().join(", ");
    tail.push(`[${outputs.length} display output(s) not shown here: ${kinds}]`);
  }
  const files = e.files ?? [];
  if (files.length > 0) {
    const names = files.slice(0, 20).map((f) => f.path).join(", ") + (files.length > 20 ? ", ..." : "");
    tail.push(`[files left in ./outputs: ${names}]`);
  }
  if (e.session_ended) {
    tail.push(
      "[the session's interpreter has ended: the next code starts a fresh one, " +
        "without the earlier variables and files]",
    );
  }
  if (parts.length === 0 && head.length === 0) head.push("(the code ran and printed nothing)");

  const fixed =
    [...head, ...tail].reduce((n, x) => n + x.length + 1, 0) +
    parts.reduce((n, [label]) => n + label.length + 1, 0);
  const shares = share(
    parts.map(([, body]) => body.length),
    Math.max(maxChars - fixed, MIN_SHARE * parts.length),
  );
  const body = parts.map(([label, text], i) => label + clip(text, shares[i] ?? MIN_SHARE));
  return clip([...head, ...body, ...tail].join("\n"), maxChars);
}

/**
 * `text` whole if it fits in `limit` characters (UTF-16 code units), else its beginning and
 * end around a note of how much was cut. A cut never splits a surrogate pair.
 */
export function clip(text: string, limit: number): string {
  if (text.length <= limit) return text;
  const marker = (n: number): string => `\n[... ${n} characters cut ...]\n`;
  const room = Math.max(limit - marker(text.length).length, 0);
  const head = pairSafe(text, Math.floor(room / 2), "down");
  const tailStart = pairSafe(text, text.length - (room - Math.floor(room / 2)), "up");
  return text.slice(0, head) + marker(tailStart - head) + text.slice(tailStart);
}

/**
 * The code inside a Markdown fence (```python ... ```) when the whole input is one; models add
 * them to tool arguments often. Anything else is returned as it is. (String operations, not
 * one regular expression over the input: a model's input must not cost quadratic time.)
 */
export function stripFences(code: string): string {
  const text = code.trim();
  if (text.length < 6 || !text.startsWith("```") || !text.endsWith("```")) return code;
  const inner = text.slice(3, -3);
  const newline = inner.indexOf("\n");
  if (newline < 0 || !/^[A-Za-z0-9_+-]*[ \t]*$/.test(inner.slice(0, newline))) return code;
  const rest = inner.slice(newline + 1).replace(/[ \t]+$/, "");
  return rest.endsWith("\n") ? rest.slice(0, -1) : rest;
}

/**
 * A result as the sandbox would have printed it, as near as its data allows, from the JSON the
 * server sent: airlock's typed forms (`{"$airlock": "int", ...}`, README "What comes back")
 * are shown as the Python values they stand for, so `2 ** 70`, `nan` and `b'...'` read as in
 * Python. Nothing is evaluated.
 */
export function show(value: unknown): string {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") return pyFloat(value);
  if (typeof value === "bigint") return value.toString();
  if (typeof value === "string") return pyStr(value);
  if (Array.isArray(value)) return `[${value.map(show).join(", ")}]`;
  if (typeof value !== "object") return String(value);
  const form = value as Record<string, unknown>;
  if (typeof form["$airlock"] === "string") return showForm(form["$airlock"], form);
  return `{${Object.entries(form).map(([k, v]) => `${pyStr(k)}: ${show(v)}`).join(", ")}}`;
}

function showForm(kind: string, f: Record<string, unknown>): string {
  const items = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);
  switch (kind) {
    case "int":
    case "decimal":
      return kind === "int" ? String(f["value"]) : `Decimal(${pyStr(String(f["value"]))})`;
    case "float":
      return String(f["value"]);
    case "bytes":
      return pyBytes(typeof f["base64"] === "string" ? f["base64"] : "");
    case "set": {
      const body = items(f["items"]).map(show).join(", ");
      const type = f["type"] === "frozenset" ? "frozenset" : "set";
      if (!body) return `${type}()`;
      return type === "set" ? `{${body}}` : `frozenset({${body}})`;
    }
    case "dict":
      return `{${items(f["items"]).map((kv) => items(kv).map(show).join(": ")).join(", ")}}`;
    case "datetime":
      return `${String(f["type"])}.fromisoformat(${pyStr(String(f["iso"]))})`;
    case "timedelta":
      return `datetime.timedelta(seconds=${show(f["seconds"])})`;
    case "complex":
      return `complex(${show(f["real"])}, ${show(f["imag"])})`;
    case "ndarray":
      return `array(${show(f["data"])}, dtype=${String(f["dtype"])})`;
    case "dataframe":
      return table(`DataFrame, columns ${show(f["columns"])}`, items(f["index"]), items(f["records"]), "rows");
    case "series":
      return table(`Series ${show(f["name"])}`, items(f["index"]), items(f["data"]), "values");
    case "repr":
      return String(f["repr"]) + (f["truncated"] === true ? " [repr cut]" : "");
    default:
      return JSON.stringify(f);
  }
}

function table(title: string, index: unknown[], rows: unknown[], noun: string): string {
  const lines = rows.slice(0, ROWS).map((row, i) => `${show(index[i])}: ${show(row)}`);
  if (rows.length > ROWS) lines.push(`... (${rows.length} ${noun})`);
  return [title, ...lines].join("\n");
}

// Python's repr of a float: exponent form below 1e-4 and from 1e16, `e-05` with two digits.
function pyFloat(n: number): string {
  if (Number.isNaN(n)) return "nan";
  if (!Number.isFinite(n)) return n > 0 ? "inf" : "-inf";
  if (Number.isInteger(n) && Math.abs(n) < 1e16) return String(n);
  const abs = Math.abs(n);
  if (abs >= 1e16 || abs < 1e-4) {
    const [mantissa, exp = "0"] = n.toExponential().split("e");
    const e = Number(exp);
    return `${mantissa}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
  }
  return String(n);
}

function pyStr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const code = ch.codePointAt(0) ?? 0;
    if (ch === quote || ch === "\\") out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (code < 0x20 || code === 0x7f) out += `\\x${code.toString(16).padStart(2, "0")}`;
    else out += ch;
  }
  return out + quote;
}

function pyBytes(base64: string): string {
  let binary: string;
  try {
    binary = atob(base64);
  } catch {
    return `<bytes: malformed base64>`;
  }
  const quote = binary.includes("'") && !binary.includes('"') ? '"' : "'";
  let out = "b" + quote;
  for (let i = 0; i < binary.length; i++) {
    const code = binary.charCodeAt(i);
    const ch = binary[i] ?? "";
    if (ch === quote || ch === "\\") out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (code < 0x20 || code >= 0x7f) out += `\\x${code.toString(16).padStart(2, "0")}`;
    else out += ch;
  }
  return out + quote;
}

function trimNewlines(s: string): string {
  let end = s.length;
  while (end > 0 && s[end - 1] === "\n") end--;
  return s.slice(0, end);
}

/**
 * Splits `budget` between parts of these lengths: short parts keep all of theirs, long ones
 * share the rest equally (water-filling).
 */
function share(lengths: number[], budget: number): number[] {
  const shares = lengths.map(() => 0);
  let left = budget;
  const order = lengths.map((_, i) => i).sort((a, b) => (lengths[a] ?? 0) - (lengths[b] ?? 0));
  order.forEach((i, k) => {
    const fair = Math.floor(left / (order.length - k));
    shares[i] = Math.max(Math.min(lengths[i] ?? 0, fair), MIN_SHARE);
    left -= shares[i] ?? 0;
  });
  return shares;
}

// A cut at `at`, moved off the middle of a surrogate pair.
function pairSafe(text: string, at: number, direction: "up" | "down"): number {
  const code = text.charCodeAt(at);
  if (at > 0 && at < text.length && code >= 0xdc00 && code <= 0xdfff) return direction === "up" ? at + 1 : at - 1;
  return at;
}

function statusLine(e: ExecutionLike): string {
  let why = WHY[e.status]?.(e.limits) ?? "";
  if (e.status === "crashed" && e.signal !== undefined && e.signal !== null) why += ` (signal ${e.signal})`;
  if (e.status === "error" && !e.error) {
    why = e.exit_code !== undefined && e.exit_code !== null ? `it exited with code ${e.exit_code}` : "";
  }
  const hit = e.limits_hit && e.limits_hit.length > 0 ? ` (limits hit: ${e.limits_hit.join(", ")})` : "";
  return `status: ${e.status}${hit}` + (why ? `: ${why}` : "");
}
