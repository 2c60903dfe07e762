import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { KEY, launch, type Server } from "./harness.js";
import { built } from "./readme-check.js";

// The package as a new user gets it: built, packed, installed from the tarball into an empty
// directory, then imported by name from plain Node ESM, Deno, Bun and Cloudflare's workerd.
const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));
const CACHE = "/root/.cache/airlock/npm";
const BIN = join(PACKAGE, "node_modules", ".bin");
// A Worker's behaviour is that of its date; workerd refuses one newer than itself.
const COMPATIBILITY_DATE = "2026-11-01";

// What each runtime runs: the import, one run() and what it answered, as JSON.
const IMPORT = `import { Airlock, VERSION, RateLimitedError } from "airlock-client";`;
const RUN = `const e = await airlock.run("print('hi')\\n6 * 7");`;
const ANSWER = `JSON.stringify({ version: VERSION, result: e.result, stdout: e.stdout, errors: typeof RateLimitedError })`;

const PROGRAM = `${IMPORT}
const airlock = new Airlock();
${RUN}
console.log(${ANSWER});
`;

// A Worker has no environment: the server's URL and key are its bindings.
const WORKER = `${IMPORT}
export default {
  async fetch(request, env) {
    try {
      const airlock = new Airlock({ baseUrl: env.AIRLOCK_URL, apiKey: env.AIRLOCK_API_KEY });
      ${RUN}
      return new Response(${ANSWER}, { headers: { "content-type": "application/json" } });
    } catch (error) {
      return new Response(String(error instanceof Error ? error.stack : error), { status: 500 });
    }
  },
};
`;

let server: Server;
let dir: string;

before(async () => {
  server = await launch();
  dir = mkdtempSync(join(tmpdir(), "airlock-ts-package-"));
  built();
  execFileSync("npm", ["pack", "--ignore-scripts", "--pack-destination", dir, "--cache", CACHE], { cwd: PACKAGE, stdio: "pipe" });
  const [tarball] = readdirSync(dir).filter((f) => f.endsWith(".tgz"));
  assert.ok(tarball, "npm pack made a tarball");
  const user = join(dir, "user");
  execFileSync("mkdir", [user]);
  writeFileSync(join(user, "package.json"), JSON.stringify({ name: "user", private: true, type: "module" }));
  execFileSync("npm", ["install", "--cache", CACHE, "--offline", "--no-audit", "--no-fund", join(dir, tarball)], {
    cwd: user,
    stdio: "pipe",
  });
  writeFileSync(join(user, "main.mjs"), PROGRAM);
});

after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function env(): NodeJS.ProcessEnv {
  return { ...process.env, AIRLOCK_URL: server.url, AIRLOCK_API_KEY: KEY, DENO_DIR: join(dir, "deno"), DENO_NO_UPDATE_CHECK: "1" };
}

const EXPECTED = { version: "0.1.0", result: 42, stdout: "hi\n", errors: "function" };

test("the packed package holds only what it should", () => {
  const listed = execFileSync("tar", ["-tzf", join(dir, readdirSync(dir).find((f) => f.endsWith(".tgz")) ?? "")], { encoding: "utf8" });
  const files = listed.trim().split("\n");
  assert.ok(files.includes("package/dist/index.js") && files.includes("package/dist/index.d.ts"), listed);
  assert.ok(files.includes("package/README.md"), listed);
  assert.ok(!files.some((f) => f.startsWith("package/build/") || f.startsWith("package/src/") || f.startsWith("package/test/")), listed);
});

test("installed from its tarball, it is imported and runs code from plain Node ESM", () => {
  const out = execFileSync("node", ["main.mjs"], { cwd: join(dir, "user"), env: env(), encoding: "utf8" });
  assert.deepEqual(JSON.parse(out), EXPECTED);
});

test("installed from its tarball, it is imported and runs code from Deno", () => {
  const out = execFileSync(join(BIN, "deno"), ["run", "--allow-net", "--allow-env", "--allow-read", "main.mjs"], {
    cwd: join(dir, "user"),
    env: env(),
    encoding: "utf8",
  });
  assert.deepEqual(JSON.parse(out), EXPECTED);
});

test("installed from its tarball, it is imported and runs code from Bun", () => {
  const out = execFileSync(join(BIN, "bun"), ["main.mjs"], { cwd: join(dir, "user"), env: env(), encoding: "utf8" });
  assert.deepEqual(JSON.parse(out), EXPECTED);
});

test("installed from its tarball, it is imported and runs code in a Cloudflare Worker (workerd)", async () => {
  const workerd = await startWorkerd(join(dir, "user"));
  try {
    const answer = await fetch(`http://127.0.0.1:${workerd.port}/`, { signal: AbortSignal.timeout(60_000) });
    const text = await answer.text();
    assert.equal(answer.status, 200, `${text}\n${workerd.log()}`);
    assert.deepEqual(JSON.parse(text), EXPECTED);
  } finally {
    await workerd.stop();
  }
});

/** Starts workerd on a loopback port with `WORKER` and the package installed in `user` as its
 * modules: the files as they are, no bundler (the entry point under the package's name, as its
 * `exports` give it; the modules it imports beside it, where their `./x.js` lead). */
async function startWorkerd(user: string): Promise<{ port: number; log: () => string; stop: () => Promise<void> }> {
  const installed = join(user, "node_modules", "airlock-client");
  const manifest = JSON.parse(readFileSync(join(installed, "package.json"), "utf8")) as { exports: { ".": { import: string } } };
  const entry = manifest.exports["."].import.replace(/^\.\/dist\//, "");
  const modules = readdirSync(join(installed, "dist"))
    .filter((f) => f.endsWith(".js"))
    .map((f) => `(name = "${f === entry ? "airlock-client" : f}", esModule = embed "node_modules/airlock-client/dist/${f}")`);
  writeFileSync(join(user, "worker.js"), WORKER);
  writeFileSync(
    join(user, "config.capnp"),
    `using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .worker),
    # The default network reaches public addresses only; the server is on loopback.
    (name = "loopback", network = (allow = ["local"])),
  ],
  sockets = [(name = "http", address = "127.0.0.1:0", http = (), service = "main")],
);
const worker :Workerd.Worker = (
  modules = [(name = "worker.js", esModule = embed "worker.js"), ${modules.join(", ")}],
  compatibilityDate = "${COMPATIBILITY_DATE}",
  bindings = [(name = "AIRLOCK_URL", text = "${server.url}"), (name = "AIRLOCK_API_KEY", text = "${KEY}")],
  globalOutbound = "loopback",
);
`,
  );
  // fd 3 is workerd's control channel: a JSON line says which port a socket listens on.
  const proc = spawn(join(BIN, "workerd"), ["serve", "config.capnp", "--control-fd=3"], {
    cwd: user,
    stdio: ["ignore", "pipe", "pipe", "pipe"],
  });
  let log = "";
  proc.stdout?.on("data", (chunk: Buffer) => (log += chunk.toString()));
  proc.stderr?.on("data", (chunk: Buffer) => (log += chunk.toString()));
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  const stop = async (): Promise<void> => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
    await exited;
  };
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const port = await new Promise<number>((resolve, reject) => {
      timer = setTimeout(() => reject(new Error(`workerd did not listen within 60 s:\n${log}`)), 60_000);
      let pending = "";
      proc.stdio[3]?.on("data", (chunk: Buffer) => {
        pending += chunk.toString();
        const lines = pending.split("\n");
        pending = lines.pop() ?? "";
        for (const line of lines) {
          const event = JSON.parse(line) as { event?: string; socket?: string; port?: number };
          if (event.event === "listen" && event.socket === "http" && typeof event.port === "number") resolve(event.port);
        }
      });
      void exited.then(() => reject(new Error(`workerd exited (${proc.exitCode ?? proc.signalCode}):\n${log}`)));
    });
    return { port, log: () => log, stop };
  } catch (error) {
    await stop();
    throw error;
  } finally {
    clearTimeout(timer);
  }
}
