import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { KEY, launch, type Server } from "./harness.js";
import { built } from "./readme-check.js";

// The package as a new user gets it: built, packed, installed from the tarball into an empty
// directory, then imported by name from plain Node ESM and from Deno.
const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));
const CACHE = "/root/.cache/airlock/npm";
const DENO = join(PACKAGE, "node_modules", ".bin", "deno");

const PROGRAM = `import { Airlock, VERSION, RateLimitedError } from "airlock-client";
const airlock = new Airlock();
const e = await airlock.run("print('hi')\\n6 * 7");
console.log(JSON.stringify({ version: VERSION, result: e.result, stdout: e.stdout, errors: typeof RateLimitedError }));
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
  const out = execFileSync(DENO, ["run", "--allow-net", "--allow-env", "--allow-read", "main.mjs"], {
    cwd: join(dir, "user"),
    env: env(),
    encoding: "utf8",
  });
  assert.deepEqual(JSON.parse(out), EXPECTED);
});
