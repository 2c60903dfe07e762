// Environments (docs/environments.md): named Python environments beyond the interpreter's own
// packages, the operator's (built under the `admin` scope), used by name in runs and sessions
// (`environment: "name"`).

import { array } from "./files.js";
import { segment, type CallOptions, type Transport } from "./http.js";
import { object } from "./results.js";
import type { operations } from "./openapi.gen.js";

/** An environment: `name`, `hash` (of the interpreter and the sorted requirements: where it
 * is stored), `requirements`, `packages` installed (`name==version`), `python`,
 * `created_at`, `size_bytes`. */
export type EnvironmentInfo = operations["getEnvironment"]["responses"][200]["content"]["application/json"];

/** A build's answer: the environment, whether it was built (`false`: an identical build was
 * reused) and the last lines of its log. */
export interface BuiltEnvironment extends EnvironmentInfo {
  built?: boolean;
  log_tail?: string[];
}

/** The named environments (`airlock.environments`). Using one is naming it in a run's,
 * a stream's, a background execution's or a session's options: `environment: "datasci"`
 * (an unknown name is an `InvalidRequestError` naming the field `environment`). */
export class Environments {
  readonly #transport: Transport;

  /** The environments reached through `transport`. */
  constructor(transport: Transport) {
    this.#transport = transport;
  }

  /** Every named environment. */
  async list(options: CallOptions = {}): Promise<EnvironmentInfo[]> {
    const answer = await this.#transport.request({ method: "GET", path: "/v1/environments" }, "json", options);
    return array(answer.body, "$").map((e, i) => object(e, `$[${i}]`) as EnvironmentInfo);
  }

  /** One environment (`NotFoundError` when there is none of that name). */
  async show(name: string, options: CallOptions = {}): Promise<EnvironmentInfo> {
    const answer = await this.#transport.request({ method: "GET", path: environmentPath(name) }, "json", options);
    return object(answer.body, "$") as EnvironmentInfo;
  }

  /** Builds the environment `name` from PEP 508 `requirements` in a sandbox whose only
   * egress is the package index, and names it; answers when the build is done, which can
   * take minutes (give no `timeoutMs` shorter than the server's build timeout). Scope
   * `admin` (`ForbiddenError` without it); `InvalidRequestError` for a requirement it refuses
   * before building (an option, a URL, a path), `BuildFailedError` when pip refused them
   * (its last lines in the message), `ConflictError` while another build of the name runs. */
  async build(name: string, requirements: readonly string[], options: CallOptions = {}): Promise<BuiltEnvironment> {
    if (!Array.isArray(requirements)) throw new TypeError('requirements is a list: ["six==1.16.0"]');
    const answer = await this.#transport.request(
      { method: "POST", path: "/v1/environments", json: { name, requirements: [...requirements] }, ok: [201] },
      "json",
      options,
    );
    return object(answer.body, "$") as BuiltEnvironment;
  }

  /** Removes the name (and its stored tree when no other name uses it). Scope `admin`. */
  async delete(name: string, options: CallOptions = {}): Promise<void> {
    await this.#transport.request({ method: "DELETE", path: environmentPath(name), ok: [204] }, "none", options);
  }
}

function environmentPath(name: string): string {
  return `/v1/environments/${segment(name, "an environment name")}`;
}
