// A real `airlock serve` on a loopback port for the client's tests, configured as the Python
// client's tests configure theirs (clients/python/tests/conftest.py), with the keys they need:
// `KEY` (every scope but admin, the crm tools of tool_server.py), `EXECUTE_ONLY` (no `read`),
// `SLOW` (one request a minute, for 429 and `Retry-After`), `BURST` (thirty a minute: a 429
// that asks for a second or two), `APPROVER` (scope `approve`, for the calls of
// `EXECUTE_ONLY`, whose code may call `crm.write_note`, which needs an approval), `OTHER` (a
// plain key, to see none of `KEY`'s), `ADMIN` (scopes execute, read and admin: builds of
// environments). The binary is `$AIRLOCK_TEST_BIN` (by default the repository's debug build),
// the tool server's Python `$AIRLOCK_TEST_MCP_PYTHON` (by default the venv `scripts/lib.sh
// ensure_mcp_client` makes).

import { spawn, type ChildProcess } from "node:child_process";
import { after, before } from "node:test";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository's root (this file runs from clients/typescript/build/test/). */
export const ROOT = fileURLToPath(new URL("../../../../", import.meta.url));
export const KEY = "client-test-key-0123456789abcdef";
export const EXECUTE_ONLY = "client-execute-only-0123456789ab";
export const SLOW = "client-slow-key-0123456789abcdef";
export const BURST = "client-burst-key-0123456789abcde";
export const APPROVER = "client-approver-0123456789abcdef";
export const OTHER = "client-other-key-0123456789abcdef";
export const ADMIN = "client-admin-key-0123456789abcde";
/** The requests a minute `BURST` may make. */
export const BURST_PER_MINUTE = 30;
/** Each key's volumes may hold this many bytes in all: small, so that a test passes it. */
export const VOLUME_QUOTA = 256 << 20;
/** Each key's background executions may store this many bytes. */
export const BACKGROUND_BYTES = 8 << 20;

function hash(key: string): string {
  return "sha256:" + createHash("sha256").update(key).digest("hex");
}

/** The `airlock` binary the tests run. */
export function binary(): string {
  const path = process.env["AIRLOCK_TEST_BIN"] ?? join(ROOT, "target", "debug", "airlock");
  if (!existsSync(path)) {
    throw new Error(`${path} does not exist: build it (cargo build -p airlock) or set AIRLOCK_TEST_BIN`);
  }
  return path;
}

function toolsConfig(): string {
  const python = process.env["AIRLOCK_TEST_MCP_PYTHON"] ?? join(ROOT, "target", "mcp-client", "bin", "python");
  if (!existsSync(python)) {
    throw new Error(`${python} is missing: run \`. scripts/lib.sh && ensure_mcp_client\` or set AIRLOCK_TEST_MCP_PYTHON`);
  }
  const script = join(ROOT, "crates", "cli", "tests", "tool_server.py");
  return `[tools.servers.crm]\ncommand = "${python}"\nargs = ["${script}", "stdio"]\napproval = ["write_note"]\n`;
}

/** The server's configuration: the tool server and the keys. */
export function config(): string {
  return `
${toolsConfig()}
[[keys]]
name = "client"
hash = "${hash(KEY)}"
tools = ["crm.*"]

[[keys]]
name = "execute-only"
hash = "${hash(EXECUTE_ONLY)}"
scopes = ["execute"]
tools = ["crm.write_note"]

[[keys]]
name = "approver"
hash = "${hash(APPROVER)}"
scopes = ["approve"]
approves = ["execute-only"]

[[keys]]
name = "other"
hash = "${hash(OTHER)}"

[[keys]]
name = "admin"
hash = "${hash(ADMIN)}"
scopes = ["execute", "read", "admin"]

[[keys]]
name = "slow"
hash = "${hash(SLOW)}"
rate_per_minute = 1

[[keys]]
name = "burst"
hash = "${hash(BURST)}"
rate_per_minute = ${BURST_PER_MINUTE}

[volumes]
max_bytes_per_key = ${VOLUME_QUOTA}

[background]
max_bytes_per_key = ${BACKGROUND_BYTES}
`;
}

/** A running server. */
export interface Server {
  readonly url: string;
  readonly pid: number;
  /** Its directory: `airlock.toml` and `state/`. */
  readonly dir: string;
  /** What it wrote on stderr so far. */
  log(): string;
  /** SIGTERM; it must exit 0 and leave no cgroup of its own behind. */
  stop(): Promise<void>;
  /** Ends it at once with `signal` (a crash); its cgroups are the kernel's to clean. */
  kill(signal?: NodeJS.Signals): Promise<void>;
}

/** Options of `launch`. */
export interface LaunchOptions {
  /** The directory of its config and state (an earlier server's state is kept); a new
   * temporary one by default, removed when it stops. */
  dir?: string;
  /** The address to listen on; `127.0.0.1:0` by default. */
  listen?: string;
  /** TOML put before the configuration. */
  extra?: string;
  /** The command line that starts the server, given its own (it must end by exec'ing that,
   * so that the server keeps the child's pid). */
  wrap?: (argv: string[]) => string[];
}

/** Starts `airlock serve` and resolves once it listens. */
export async function launch(options: LaunchOptions = {}): Promise<Server> {
  const own = options.dir === undefined;
  const dir = options.dir ?? mkdtempSync(join(tmpdir(), "airlock-test-ts-"));
  writeFileSync(join(dir, "airlock.toml"), (options.extra ?? "") + config());
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!k.startsWith("AIRLOCK_") && v !== undefined) env[k] = v;
  }
  // One warm sandbox and no zygote: enough for these tests, and quick to start.
  env["AIRLOCK_POOL__SIZE"] = "1";
  env["AIRLOCK_ZYGOTE__ENABLED"] = "false";
  const argv = [
    binary(),
    "serve",
    "--listen",
    options.listen ?? "127.0.0.1:0",
    "--config",
    join(dir, "airlock.toml"),
    "--state-dir",
    join(dir, "state"),
  ];
  const [command = "", ...args] = options.wrap?.(argv) ?? argv;
  const proc = spawn(command, args, { stdio: ["ignore", "ignore", "pipe"], env });
  let log = "";
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  const url = await new Promise<string>((resolve, reject) => {
    let pending = "";
    const timer = setTimeout(() => reject(new Error(`airlock serve did not listen within 60 s:\n${log}`)), 60_000);
    // Read to the end, always: a full pipe would block the server's log.
    proc.stderr?.setEncoding("utf8");
    proc.stderr?.on("data", (chunk: string) => {
      log += chunk;
      pending += chunk;
      let nl: number;
      while ((nl = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, nl);
        pending = pending.slice(nl + 1);
        if (line.startsWith("airlock: listening on ")) {
          clearTimeout(timer);
          resolve(line.slice("airlock: listening on ".length).trim());
        }
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`airlock serve exited (${code}):\n${log}`));
    });
  });
  const pid = proc.pid ?? 0;
  const cleanup = (): void => {
    if (own) rmSync(dir, { recursive: true, force: true });
  };
  return {
    url,
    pid,
    dir,
    log: () => log,
    async stop() {
      await stopProcess(proc, exited, pid);
      cleanup();
    },
    async kill(signal: NodeJS.Signals = "SIGKILL") {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      await exited;
    },
  };
}

async function stopProcess(proc: ChildProcess, exited: Promise<number | null>, pid: number): Promise<void> {
  if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
  // A timer left pending would keep the test file's process alive for its 30 s.
  let timer: ReturnType<typeof setTimeout> | undefined;
  const hung = new Promise<"hung">((resolve) => {
    timer = setTimeout(() => resolve("hung"), 30_000);
  });
  const code = await Promise.race([exited, hung]);
  clearTimeout(timer);
  if (code === "hung") {
    proc.kill("SIGKILL");
    throw new Error("airlock serve did not stop within 30 s of SIGTERM");
  }
  if (code !== 0) throw new Error(`airlock serve exited with ${code} after SIGTERM`);
  const left = cgroups().filter((p) => p.split("/").pop()?.startsWith(`airlock-${pid}-`));
  if (left.length > 0) throw new Error(`cgroups left behind: ${left.join(", ")}`);
}

/** The `airlock-*` cgroups on this host. */
export function cgroups(): string[] {
  const root = "/sys/fs/cgroup";
  if (!existsSync(root)) return [];
  const found: string[] = [];
  const dirs = [root, ...readdirSync(root).map((n) => join(root, n))].filter((d) => {
    try {
      return statSync(d).isDirectory();
    } catch {
      return false;
    }
  });
  for (const d of dirs) {
    for (const name of readdirSync(d)) {
      if (name.startsWith("airlock-")) found.push(join(d, name));
    }
  }
  return found;
}

/** Resolves after `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `check` until it returns a value other than undefined, or throws after `ms`. */
export async function eventually<T>(what: string, check: () => Promise<T | undefined>, ms = 30_000): Promise<T> {
  const until = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > until) throw new Error(`${what}: not within ${ms} ms`);
    await sleep(50);
  }
}

/** A server for the tests of one file: started before them and stopped (checked as `stop`
 * checks) after them. The returned function gives it; its `ready` waits until it listens (root
 * hooks may run side by side). */
export function useServer(options: LaunchOptions = {}): (() => Server) & { ready: () => Promise<Server> } {
  let server: Server | undefined;
  let started: Promise<Server> | undefined;
  const ready = (): Promise<Server> => (started ??= launch(options).then((s) => (server = s)));
  before(ready);
  after(async () => {
    await started?.then((s) => s.stop());
  });
  return Object.assign(
    () => {
      if (server === undefined) throw new Error("the test server did not start");
      return server;
    },
    { ready },
  );
}
