// Runs `node <args>` under Node 22, for the adapters' tests: the current majors of the AI SDK
// (ai@7, Node >= 22) and Mastra (@mastra/core@1, Node >= 22.13) do not run on Node 20, which
// the package itself supports. Node comes from the npm registry (the `node-<os>-<arch>`
// packages hold the official binaries) and is kept under ~/.cache/airlock/ (or
// $XDG_CACHE_HOME/airlock), installed on first use. Under Node 22 or later already, that node runs.
//
//     node scripts/node22.mjs --test build/test/adapters-ai-sdk.test.js
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

const VERSION = "22.23.5";
const major = Number(process.versions.node.split(".")[0]);
const cache = join(process.env.XDG_CACHE_HOME || join(homedir(), ".cache"), "airlock");

function node22() {
  if (major >= 22) return process.execPath;
  const pkg = `node-${process.platform === "win32" ? "win" : process.platform}-${process.arch}`;
  const prefix = join(cache, `node-${VERSION}`);
  const bin = join(prefix, "node_modules", pkg, "bin", process.platform === "win32" ? "node.exe" : "node");
  if (!existsSync(bin)) {
    process.stderr.write(`==> installing ${pkg}@${VERSION} from the npm registry into ${prefix}\n`);
    const npm = process.platform === "win32" ? "npm.cmd" : "npm";
    const install = spawnSync(
      npm,
      ["install", "--no-audit", "--no-fund", "--no-save", "--prefix", prefix,
       "--cache", join(cache, "npm"), `${pkg}@${VERSION}`],
      { stdio: "inherit" },
    );
    if (install.status !== 0 || !existsSync(bin)) {
      process.stderr.write(`could not install Node ${VERSION} (${pkg}); run the adapters' tests under Node >= 22\n`);
      process.exit(install.status || 1);
    }
  }
  return bin;
}

const run = spawnSync(node22(), process.argv.slice(2), { stdio: "inherit" });
process.exit(run.status ?? 1);
