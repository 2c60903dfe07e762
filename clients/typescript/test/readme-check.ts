// What the tests of the built package share: `dist/` built once (`npm test` builds it first),
// and examples type-checked as a user's strict project would, against it.

import { execFileSync } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import ts from "typescript";

/** The package's directory. */
export const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));

/** Builds `dist/` unless it is newer than every file of `src/` (a test file run alone). */
export function built(): void {
  const newest = (dir: string): number =>
    Math.max(0, ...readdirSync(dir, { withFileTypes: true }).map((e) =>
      e.isDirectory() ? newest(join(dir, e.name)) : statSync(join(dir, e.name)).mtimeMs));
  let dist = 0;
  try {
    dist = statSync(join(PACKAGE, "dist", "index.js")).mtimeMs;
  } catch {
    // Not built yet.
  }
  if (dist < newest(join(PACKAGE, "src"))) execFileSync("npm", ["run", "build"], { cwd: PACKAGE, stdio: "pipe" });
}

/** The diagnostics of `files` under strict (as `tsconfig.json` sets it), formatted. */
export function strictProblems(files: string[], cwd: string): string[] {
  const program = ts.createProgram(files, {
    strict: true,
    noUncheckedIndexedAccess: true,
    exactOptionalPropertyTypes: true,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    target: ts.ScriptTarget.ES2022,
    lib: ["lib.es2022.d.ts", "lib.dom.d.ts"],
    types: ["node"],
    noEmit: true,
    skipLibCheck: true,
  });
  return ts.getPreEmitDiagnostics(program).map((d) =>
    ts.formatDiagnostic(d, { getCanonicalFileName: (f) => f, getCurrentDirectory: () => cwd, getNewLine: () => "\n" }),
  );
}
