// Credentials held at the proxy, named by a client: the API has no route that lists or shows
// them (a key's grants are the operator's configuration); a client names them in a run's, a
// stream's, a background execution's or a session's `credentials`, and only those its key was
// granted (docs/egress.md, "Credentials").

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { Airlock, ForbiddenError } from "../src/index.js";
import { KEY, launch, type Server } from "./harness.js";

const GRANTED = "client-granted-key-0123456789abc";

let dir: string;
let server: Server;
let granted: Airlock;
let plain: Airlock;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "airlock-test-ts-credentials-"));
  writeFileSync(join(dir, "secret"), "s3cret-token-value");
  const extra = `
[credentials.echo]
hosts = [{ host = "echo.test", ports = [443] }]
[credentials.echo.headers]
Authorization = { file = "${join(dir, "secret")}", format = "Bearer {}" }

[[keys]]
name = "granted"
hash = "sha256:${createHash("sha256").update(GRANTED).digest("hex")}"
egress = { hosts = [{ host = "echo.test", ports = [443] }] }
credentials = ["echo"]
`;
  server = await launch({ extra });
  granted = new Airlock({ baseUrl: server.url, apiKey: GRANTED });
  plain = new Airlock({ baseUrl: server.url, apiKey: KEY });
});

after(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

test("credentials are asked for by name, and only those granted", async () => {
  // The granted key may name its credential, or none; the code never sees its value.
  const e = await granted.run("import os\nsorted(k for k, v in os.environ.items() if 's3cret' in v)", { credentials: ["echo"] });
  assert.ok(e.ok, JSON.stringify(e.error));
  assert.deepEqual(e.result, []);
  assert.ok((await granted.run("1", { credentials: [] })).ok);
  const job = await granted.submit("2", { credentials: ["echo"] });
  assert.equal((await job.wait()).result, 2);
  await job.cancel();
  const s = await granted.session({ credentials: ["echo"] });
  await s.close();
  assert.equal((await granted.stream("3", { credentials: ["echo"] }).result()).result, 3);

  // A name the key was not granted is refused, naming the field; for every kind of request.
  for (const refused of [
    () => plain.run("1", { credentials: ["echo"] }),
    () => plain.submit("1", { credentials: ["echo"] }),
    () => plain.session({ credentials: ["echo"] }),
    () => granted.run("1", { credentials: ["github"] }),
    () => plain.stream("1", { credentials: ["echo"] }).result(),
  ]) {
    await assert.rejects(refused(), (err: unknown) => {
      assert.ok(err instanceof ForbiddenError, String(err));
      assert.deepEqual([err.status, err.code, err.field], [403, "forbidden", "credentials"]);
      return true;
    });
  }
  assert.ok((await plain.run("1", { credentials: [] })).ok);
  // A list of names, never one name.
  await assert.rejects(plain.run("1", { credentials: "echo" as unknown as string[] }), TypeError);
  await assert.rejects(plain.session({ credentials: "echo" as unknown as string[] }), TypeError);
});
