import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { useServer } from "./harness.js";
import { GENERATED, generate } from "./openapi-gen.js";

const server = useServer();

test("the checked-in types are those of the OpenAPI document the server serves", async () => {
  const served = await generate(server().url);
  const checkedIn = readFileSync(GENERATED, "utf8");
  assert.ok(
    served === checkedIn,
    "src/openapi.gen.ts differs from the served OpenAPI document: run `npm run gen-types` (and review the change)",
  );
});
