import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import ts from "typescript";

import { built, strictProblems } from "./readme-check.js";
import { APPROVER, EXECUTE_ONLY, KEY, launch, type Server } from "./harness.js";

// Every TypeScript block of the README marked `ts run` is type-checked against the built
// package and run against a real server, as a user would paste it (`airlock-client` resolves
// to this package by its own name).
const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));
const WORK = join(PACKAGE, "build", "readme");
const README = readFileSync(join(PACKAGE, "README.md"), "utf8");
const BLOCKS = [...README.matchAll(/^```ts run\n([\s\S]*?)^```$/gm)].map((m) => m[1] ?? "");

let server: Server;

before(async () => {
  server = await launch();
  built();
  rmSync(WORK, { recursive: true, force: true });
  mkdirSync(WORK, { recursive: true });
  BLOCKS.forEach((code, i) => writeFileSync(join(WORK, `block${i}.mts`), code));
});

after(async () => {
  await server?.stop();
});

test("the README has runnable examples", () => {
  assert.ok(BLOCKS.length >= 8, `${BLOCKS.length} blocks`);
});

test("the README's examples type-check under strict", () => {
  const files = BLOCKS.map((_, i) => join(WORK, `block${i}.mts`));
  const problems = strictProblems(files, WORK);
  assert.deepEqual(problems, []);
});

for (const [i, code] of BLOCKS.entries()) {
  const first = code.split("\n").find((l) => l.startsWith("const ") || l.startsWith("let ")) ?? "";
  test(`README example ${i + 1} runs (${first.slice(0, 60)})`, () => {
    const js = ts.transpileModule(code, {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
    }).outputText;
    const file = join(WORK, `block${i}.mjs`);
    writeFileSync(file, js);
    execFileSync("node", [file], {
      cwd: WORK,
      env: { ...process.env, AIRLOCK_URL: server.url, AIRLOCK_API_KEY: KEY, AGENT_KEY: EXECUTE_ONLY, REVIEWER_KEY: APPROVER },
      stdio: "pipe",
      encoding: "utf8",
    });
  });
}
