// What the adapters' tests share (as clients/python/tests/test_adapters.py): code that reports
// where it runs, code that tries to get out, and the checks of what they printed. The tool's
// text is all a model sees; these read it as a model would.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";
import type { OpensSessions } from "../src/adapters/sandbox.js";
import { Airlock } from "../src/index.js";
import { KEY, type Server, launch } from "./harness.js";

// A secret in this process's environment (set before the server starts, so it inherits it
// too): code in the sandbox must never see it.
export const CANARY = "ADAPTER_TEST_CANARY";
process.env[CANARY] = "canary-" + randomBytes(8).toString("hex");
const THIS_FILE = fileURLToPath(import.meta.url);

/** Code that reports its uid, whether it sees this file or the canary, and whether it can
 * reach the airlock server's own port on this host's loopback. */
export function probe(serverUrl: string): string {
  const { hostname, port } = new URL(serverUrl);
  return `
import json, os, socket
facts = {"uid": os.getuid(), "sees_test_file": os.path.exists(${JSON.stringify(THIS_FILE)}),
         "canary": os.environ.get(${JSON.stringify(CANARY)})}
try:
    socket.create_connection((${JSON.stringify(hostname)}, ${port}), timeout=2).close()
    facts["network"] = "open"
except OSError as e:
    facts["network"] = type(e).__name__
print("FACTS", json.dumps(facts))
`;
}

/** Code that tries to get out: the host's shadow file, a shell writing `marker` on the host,
 * the host's environment, this test file. */
export function hostile(marker: string): string {
  return `
import json, os
out = {}
try:
    out["shadow"] = open("/etc/shadow").read()[:40]
except OSError as e:
    out["shadow"] = type(e).__name__
out["system"] = __import__("os").system("echo pwned > ${marker} 2>/dev/null")
out["canary"] = os.environ.get(${JSON.stringify(CANARY)})
try:
    open(${JSON.stringify(THIS_FILE)}).read()
    out["test_file"] = "read"
except OSError as e:
    out["test_file"] = type(e).__name__
print("HOSTILE", json.dumps(out))
`;
}

/** The JSON object printed after `tag` in a tool's text. */
export function reported(tag: string, text: string): Record<string, unknown> {
  const line = text.split("\n").find((l) => l.startsWith(`${tag} {`));
  assert.ok(line, `no ${tag} line in:\n${text}`);
  return JSON.parse(line.slice(tag.length + 1)) as Record<string, unknown>;
}

/** The probe ran in a sandbox: another uid, none of this host's files, environment or network. */
export function assertSandboxed(text: string): void {
  const facts = reported("FACTS", text);
  assert.notEqual(facts["uid"], 0);
  assert.equal(facts["sees_test_file"], false);
  assert.equal(facts["canary"], null);
  assert.notEqual(facts["network"], "open");
}

/** The hostile code got nothing out and changed nothing here. */
export function assertContained(text: string, marker: string): void {
  const out = reported("HOSTILE", text);
  assert.ok(["FileNotFoundError", "PermissionError"].includes(String(out["shadow"])), String(out["shadow"]));
  assert.equal(out["canary"], null);
  assert.ok(["FileNotFoundError", "PermissionError"].includes(String(out["test_file"])), String(out["test_file"]));
  assert.equal(existsSync(marker), false);
}

/** A key the server does not know. */
export const WRONG_KEY = "not-a-key-0123456789abcdef01234";

/** The server of a test file and a client of it, started before its tests and stopped after. */
export interface Served {
  readonly server: Server;
  readonly airlock: Airlock;
}

/** Registers hooks that start a server before the file's tests and stop it after them. */
export function serve(): Served {
  let server: Server | undefined;
  let airlock: Airlock | undefined;
  before(async () => {
    server = await launch();
    airlock = new Airlock({ baseUrl: server.url, apiKey: KEY });
  });
  after(async () => {
    await server?.stop();
  });
  return {
    get server(): Server {
      assert.ok(server, "the server is not started");
      return server;
    },
    get airlock(): Airlock {
      assert.ok(airlock, "the server is not started");
      return airlock;
    },
  };
}

/** The client's sessions, when it has them (they come with the client's session methods). */
export function sessionsOf(airlock: Airlock): OpensSessions | undefined {
  const candidate = airlock as unknown as { session?: unknown };
  return typeof candidate.session === "function" ? (airlock as unknown as OpensSessions) : undefined;
}

/** Code that draws `n` matplotlib charts, shown one by one, and prints `drawn`. */
export function charts(n: number): string {
  return `import matplotlib.pyplot as plt\nfor i in range(${n}):\n    plt.plot([1, 2, 3][: i + 2]); plt.show()\nprint("drawn")`;
}

/** A real PNG's bytes in base64: its signature and a header chunk. */
export function assertPng(base64: unknown): void {
  assert.equal(typeof base64, "string");
  const bytes = Buffer.from(String(base64), "base64");
  assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  assert.equal(bytes.subarray(12, 16).toString("latin1"), "IHDR");
}
