// The adapters' tests run under Node 22: the current majors of the AI SDK (ai@7) and Mastra
// (@mastra/core@1) need it, while the package supports Node 20. Under an older Node, a test
// file calls `delegate` instead of defining its tests: one test that runs the file under Node
// 22 (scripts/node22.mjs installs it from the npm registry into ~/.cache/airlock on first use)
// and passes when every test there passed.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { basename } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const SCRIPT = fileURLToPath(new URL("../../scripts/node22.mjs", import.meta.url));

/** Whether this Node runs the adapters' tests itself. */
export const NODE_22 = Number(process.versions.node.split(".")[0]) >= 22;

/** Defines one test that runs the test file at `url` under Node 22. */
export function delegate(url: string): void {
  const file = fileURLToPath(url);
  test(`${basename(file)} under Node 22`, (t) => {
    // Not as a child of this test runner (NODE_TEST_CONTEXT would make it report to this one
    // and run nothing of its own).
    const env = { ...process.env };
    delete env["NODE_TEST_CONTEXT"];
    const run = spawnSync(process.execPath, [SCRIPT, "--test", "--test-concurrency=1", "--test-reporter=spec", file], {
      encoding: "utf8",
      env,
      maxBuffer: 64 << 20,
    });
    const output = `${run.stdout}${run.stderr}`;
    for (const line of output.split("\n")) {
      if (/^\s*(ℹ|✔|✖|﹣)/.test(line)) t.diagnostic(line.trim());
    }
    assert.equal(run.status, 0, `the tests failed under Node 22:\n${output}`);
    // Some tests ran and passed there, none failed: an empty run is no pass.
    assert.match(output, /ℹ pass [1-9]/, output);
    assert.match(output, /ℹ fail 0/, output);
  });
}
