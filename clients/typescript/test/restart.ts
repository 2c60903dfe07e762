// A server stopped and started again on the same state directory, for the tests of what
// outlives a restart.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { launch, type Server } from "./harness.js";

/** Runs `first` against a server on a new state directory, stops that server (SIGTERM: it
 * must exit cleanly), then runs `then` with what `first` gave against a new server on the
 * same directory, which is removed at the end. */
export async function acrossRestart<T>(first: (server: Server) => Promise<T>, then: (server: Server, kept: T) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "airlock-test-ts-restart-"));
  try {
    const before = await launch({ dir });
    let kept: T;
    try {
      kept = await first(before);
    } finally {
      await before.stop();
    }
    const after = await launch({ dir });
    try {
      await then(after, kept);
    } finally {
      await after.stop();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
