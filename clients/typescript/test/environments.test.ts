// Environments against the real server, built by real pip from a local package index on
// loopback (crates/cli/tests/make_index.py, served by `python3 -m http.server`, as the
// server's own tests do): listed, shown, built under the admin scope only, used by name in
// runs, sessions and background executions, deleted; and each refusal's error class.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { Airlock, BuildFailedError, ForbiddenError, InvalidRequestError, NotFoundError } from "../src/index.js";
import { ADMIN, KEY, ROOT, launch, type Server } from "./harness.js";

let dir: string;
let index: ChildProcess;
let server: Server;
let admin: Airlock;
let client: Airlock;

/** `python3 -m http.server` over `root`; resolves with its port. */
function serve(root: string): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn("/usr/bin/python3", ["-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", root], {
    stdio: ["ignore", "pipe", "ignore"],
  });
  return new Promise((resolve, reject) => {
    let out = "";
    child.stdout?.setEncoding("utf8");
    child.stdout?.on("data", (chunk: string) => {
      out += chunk;
      // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
      const port = /port ([0-9]+)/.exec(out)?.[1];
      if (port !== undefined) resolve({ child, port: Number(port) });
    });
    child.once("exit", (code) => reject(new Error(`http.server exited (${code}): ${out}`)));
  });
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "airlock-test-ts-environments-"));
  const made = spawnSync(
    "/usr/bin/python3",
    [join(ROOT, "crates", "cli", "tests", "make_index.py"), join(dir, "index"), join(dir, "elsewhere"), "9", "0", join(dir, "victim")],
    { stdio: "inherit" },
  );
  assert.equal(made.status, 0, "make_index.py");
  const served = await serve(join(dir, "index"));
  index = served.child;
  const build =
    "[environments.build]\n" +
    `index_url = "http://127.0.0.1:${served.port}/simple/"\n` +
    `egress = { ranges = [{ cidr = "127.0.0.1/32", ports = [${served.port}] }] }\n` +
    "timeout_ms = 120000\n";
  server = await launch({ extra: build });
  admin = new Airlock({ baseUrl: server.url, apiKey: ADMIN });
  client = new Airlock({ baseUrl: server.url, apiKey: KEY });
});

after(async () => {
  await server?.stop();
  index?.kill();
  rmSync(dir, { recursive: true, force: true });
});

test("an environment is built, listed, shown, used by name and deleted", async () => {
  assert.deepEqual(await client.environments.list(), []);
  await assert.rejects(client.environments.show("tiny"), NotFoundError);
  // Building and deleting need the admin scope.
  await assert.rejects(client.environments.build("tiny", ["tinyenv-pkg==1.0"]), ForbiddenError);

  const built = await admin.environments.build("tiny", ["tinyenv-pkg==1.0"]);
  assert.equal(built.name, "tiny");
  assert.equal(built.built, true);
  assert.deepEqual(built.requirements, ["tinyenv-pkg==1.0"]);
  assert.deepEqual(built.packages, ["tinyenv_pkg==1.0"]);
  assert.match(built.hash ?? "", /^[0-9a-f]{64}$/);
  assert.ok(built.log_tail?.some((line) => line.includes("Successfully installed tinyenv-pkg-1.0")), JSON.stringify(built.log_tail));
  // The same requirements under another name reuse the build.
  const again = await admin.environments.build("tiny2", ["tinyenv-pkg==1.0"]);
  assert.equal(again.built, false);
  assert.equal(again.hash, built.hash);

  const listed = await client.environments.list();
  assert.deepEqual(listed.map((e) => e.name).sort(), ["tiny", "tiny2"]);
  const shown = await client.environments.show("tiny");
  assert.deepEqual([shown.name, shown.hash, shown.requirements], ["tiny", built.hash, ["tinyenv-pkg==1.0"]]);
  assert.ok((shown.size_bytes ?? 0) > 0);

  // Used by name: a run, a session, a background execution.
  const code = "import tinyenv_pkg\ntinyenv_pkg.VALUE";
  assert.equal((await client.run(code, { environment: "tiny" })).result, 42);
  assert.equal((await client.run("import importlib.util\nimportlib.util.find_spec('tinyenv_pkg') is None")).result, true);
  const s = await client.session({ environment: "tiny2" });
  try {
    assert.equal((await s.run(code)).result, 42);
  } finally {
    await s.close();
  }
  const job = await client.submit(code, { environment: "tiny" });
  assert.equal((await job.wait()).result, 42);
  await job.cancel();

  await assert.rejects(client.environments.delete("tiny2"), ForbiddenError);
  await admin.environments.delete("tiny2");
  await admin.environments.delete("tiny");
  await assert.rejects(client.environments.show("tiny"), NotFoundError);
  await assert.rejects(admin.environments.delete("tiny"), NotFoundError);
  await assert.rejects(client.run(code, { environment: "tiny" }), (e: unknown) => e instanceof InvalidRequestError && e.field === "environment");
});

test("a build's refusals have their error classes", async () => {
  // Refused before building: an option, a URL.
  for (const requirement of ["--index-url http://elsewhere/ x", "x @ https://example.com/x.whl"]) {
    await assert.rejects(admin.environments.build("refused", [requirement]), (e: unknown) => {
      assert.ok(e instanceof InvalidRequestError, String(e));
      assert.equal(e.status, 400);
      return true;
    });
  }
  await assert.rejects(admin.environments.build("Bad Name!", ["tinyenv-pkg"]), InvalidRequestError);
  // pip ran and refused them: no such version on the index.
  await assert.rejects(admin.environments.build("missing", ["tinyenv-pkg==9.9"]), (e: unknown) => {
    assert.ok(e instanceof BuildFailedError, String(e));
    assert.deepEqual([e.status, e.code], [422, "build_failed"]);
    return true;
  });
  const names = (await admin.environments.list()).map((e) => e.name);
  assert.ok(!names.some((n) => ["refused", "missing"].includes(n ?? "")), JSON.stringify(names));
  await assert.rejects(admin.environments.build("x", "tinyenv-pkg" as unknown as string[]), TypeError);
  await assert.rejects(admin.environments.show(".."), TypeError);
});
