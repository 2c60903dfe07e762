// What the client adds to a `print(1)` over a raw `fetch` of the same request, p50 in one run.
// `npm run bench:overhead` starts its own `airlock serve` (AIRLOCK_BENCH_BIN, by default the
// repository's release build, else its debug build) on loopback and times, request by request
// and in alternating order, `airlock.run("print(1)")` against `fetch` of the same POST with
// `JSON.parse` of its text:
// - against the real server, where a sandbox's run and its noise are in both;
// - against a loopback server that answers every POST with the bytes the real server answered
//   to one such request, where nothing but the two clients' own work differs.
// Each is also reported as the median of the paired differences (one of each, back to back).

import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { Airlock } from "../src/index.js";

const ROOT = fileURLToPath(new URL("../../../../", import.meta.url));
const KEY = "bench-overhead-key-0123456789abcdef";
const CODE = "print(1)";
const WARM = 100;
const PAIRS = Number(process.env.PAIRS ?? 1000);

function binary(): string {
  const given = process.env.AIRLOCK_BENCH_BIN;
  if (given) return given;
  for (const build of ["release", "debug"]) {
    const path = join(ROOT, "target", build, "airlock");
    if (existsSync(path)) return path;
  }
  throw new Error("no airlock binary: build it (cargo build --release -p airlock) or set AIRLOCK_BENCH_BIN");
}

/** `airlock serve` on 127.0.0.1:0 with `KEY`; resolves to its URL and a stop function. */
async function serve(): Promise<{ url: string; stop: () => Promise<void> }> {
  const state = mkdtempSync(join(tmpdir(), "airlock-bench-ts-"));
  const child = spawn(binary(), ["serve", "--listen", "127.0.0.1:0", "--state-dir", state], {
    env: { ...process.env, AIRLOCK_API_KEY: KEY },
    stdio: ["ignore", "ignore", "pipe"],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let seen = "";
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk: string) => {
      seen += chunk;
      // A whole line only: a chunk may end inside the URL.
      const found = /airlock: listening on (\S+)\n/.exec(seen);
      if (found?.[1]) resolve(found[1]);
    });
    child.on("exit", (code) => reject(new Error(`airlock serve exited (${code}):\n${seen}`)));
  });
  child.stderr.resume();
  return {
    url,
    stop: async () => {
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await exited;
      rmSync(state, { recursive: true, force: true });
    },
  };
}

/** The raw request: what a user without the client would write. */
async function raw(url: string): Promise<unknown> {
  const response = await fetch(`${url}/v1/execute`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ code: CODE }),
  });
  const body: unknown = JSON.parse(await response.text());
  if (response.status !== 200) throw new Error(`raw fetch: ${response.status}`);
  return body;
}

function p50(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] as number;
}

async function timed(work: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await work();
  return performance.now() - start;
}

/** PAIRS pairs, the order alternating; the p50s of each and of their differences. */
async function compare(what: string, url: string): Promise<void> {
  const airlock = new Airlock({ baseUrl: url, apiKey: KEY });
  for (let i = 0; i < WARM; i++) {
    await raw(url);
    await airlock.run(CODE);
  }
  const fetchTimes: number[] = [];
  const clientTimes: number[] = [];
  const differences: number[] = [];
  for (let i = 0; i < PAIRS; i++) {
    const client = () => airlock.run(CODE);
    const plain = () => raw(url);
    let a: number;
    let b: number;
    if (i % 2 === 0) {
      a = await timed(plain);
      b = await timed(client);
    } else {
      b = await timed(client);
      a = await timed(plain);
    }
    fetchTimes.push(a);
    clientTimes.push(b);
    differences.push(b - a);
  }
  const f = p50(fetchTimes);
  const c = p50(clientTimes);
  console.log(
    `${what}: fetch p50 ${f.toFixed(3)} ms, client p50 ${c.toFixed(3)} ms, ` +
      `the client adds ${(c - f).toFixed(3)} ms (p50 of the paired differences ${p50(differences).toFixed(3)} ms), ` +
      `${PAIRS} pairs`,
  );
}

const server = await serve();
try {
  // The real server's answer to one `print(1)`, replayed by a loopback server.
  const answer = await fetch(`${server.url}/v1/execute`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ code: CODE }),
  });
  const bytes = new Uint8Array(await answer.arrayBuffer());
  const headers: Record<string, string> = { "content-type": "application/json" };
  const id = answer.headers.get("x-request-id");
  if (id) headers["x-request-id"] = id;
  const replay = createServer((request, response) => {
    request.resume();
    request.on("end", () => {
      response.writeHead(200, { ...headers, "content-length": String(bytes.length) });
      response.end(bytes);
    });
  });
  await new Promise<void>((resolve) => replay.listen(0, "127.0.0.1", resolve));
  const port = (replay.address() as AddressInfo).port;
  console.log(`node ${process.version}, airlock ${binary()}, answer ${bytes.length} bytes`);
  await compare("the real server", server.url);
  await compare("the answer replayed", `http://127.0.0.1:${port}`);
  replay.close();
} finally {
  await server.stop();
}
