// `npm run gen-types`: writes src/openapi.gen.ts from the OpenAPI document of a server: the
// one at `$AIRLOCK_URL` when it is set, else one started here as the tests start theirs.

import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

import { launch } from "./harness.js";
import { GENERATED, generate } from "./openapi-gen.js";

const given = process.env["AIRLOCK_URL"];
const server = given === undefined ? await launch() : undefined;
try {
  writeFileSync(GENERATED, await generate(given ?? server!.url));
  console.log(`wrote ${fileURLToPath(GENERATED)}`);
} finally {
  await server?.stop();
}
