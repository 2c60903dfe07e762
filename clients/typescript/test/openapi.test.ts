import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { launch, type Server } from "./harness.js";
import { GENERATED, generate } from "./openapi-gen.js";

let server: Server;

before(async () => {
  server = await launch();
});

after(async () => {
  await server?.stop();
});

test("the checked-in types are those of the OpenAPI document the server serves", async () => {
  const served = await generate(server.url);
  const checkedIn = readFileSync(GENERATED, "utf8");
  assert.ok(
    served === checkedIn,
    "src/openapi.gen.ts differs from the served OpenAPI document: run `npm run gen-types` (and review the change)",
  );
});
