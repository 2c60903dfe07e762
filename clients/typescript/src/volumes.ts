// Volumes: named directories of one key's that outlive executions, sessions and restarts
// (docs/volumes.md): made, listed, deleted, their files read and written without a sandbox,
// and mounted into runs and sessions.

import { FileHolder, array, expected } from "./files.js";
import { segment, type CallOptions, type Transport } from "./http.js";
import { object } from "./results.js";
import type { operations } from "./openapi.gen.js";
import type { VolumeMount } from "./types.js";

type Json<T extends { content: { "application/json": unknown } }> = T["content"]["application/json"];

/** A volume as the server describes it; `used_bytes` and `used_entries` only from
 * `Volume.refresh()` / `volumes.show()`. */
export type VolumeInfo = Json<operations["getVolume"]["responses"][200]>;
/** One entry of a volume: `path`, `type` (`file`, `dir`, `link`, `other`), `size`, and
 * `lossy` (a name on its path is not UTF-8) or `unreadable` where so. */
export type VolumeFileEntry = Json<operations["listVolumeFiles"]["responses"][200]>["files"][number];

/** A volume's entries, and whether there were more than one listing gives (10,000 entries or
 * 4 MiB of paths). */
export interface VolumeFiles {
  files: VolumeFileEntry[];
  truncated: boolean;
}

/** What a new volume is made with besides its name and size. */
export interface CreateVolumeOptions extends CallOptions {
  /** The most files, directories and links it may hold (the server's default: one per
   * 16 KiB of its size, at least 1,024). */
  max_entries?: number | undefined;
}

/** This key's volumes (`airlock.volumes`). */
export class Volumes {
  readonly #transport: Transport;

  /** The volumes reached through `transport`. */
  constructor(transport: Transport) {
    this.#transport = transport;
  }

  /** Makes a volume of at most `sizeBytes` (8 MiB or more; counted in full against the key's
   * quota). `ConflictError` when it exists, `QuotaExceededError` past the key's quota,
   * `VolumesUnavailableError` on a server that cannot make volumes. */
  async create(name: string, sizeBytes: number, options: CreateVolumeOptions = {}): Promise<Volume> {
    segment(name, "a volume name");
    const json: { name: string; size_bytes: number; max_entries?: number } = { name, size_bytes: sizeBytes };
    if (options.max_entries !== undefined) json.max_entries = options.max_entries;
    const answer = await this.#transport.request({ method: "POST", path: "/v1/volumes", json, ok: [201] }, "json", options);
    const volume = new Volume(this.#transport, name);
    volume.info = toInfo(answer.body, "$");
    return volume;
  }

  /** This key's volumes (without their usage: `show()` has it). */
  async list(options: CallOptions = {}): Promise<VolumeInfo[]> {
    const answer = await this.#transport.request({ method: "GET", path: "/v1/volumes" }, "json", options);
    const volumes = object(answer.body, "$")["volumes"] ?? [];
    return array(volumes, "$.volumes").map((v, i) => toInfo(v, `$.volumes[${i}]`));
  }

  /** A handle on the volume `name`; nothing is asked of the server until it is used. */
  get(name: string): Volume {
    return new Volume(this.#transport, name);
  }

  /** The volume `name`, with `used_bytes` and `used_entries`. */
  show(name: string, options: CallOptions = {}): Promise<VolumeInfo> {
    return this.get(name).refresh(options);
  }

  /** Deletes the volume `name` and everything in it (`VolumeInUseError` while held). */
  delete(name: string, options: CallOptions = {}): Promise<void> {
    return this.get(name).delete(options);
  }
}

/** A handle on one of this key's volumes: its files are read and written here without a
 * sandbox, and `mount(path)` is what `run`, `stream`, `submit` and `session` take in
 * `volumes` to mount it. A writable mount, an upload or a removal is the volume's one writer
 * at a time (`VolumeBusyError` names the holder); read-only mounts share it. */
export class Volume extends FileHolder {
  /** The volume's name. */
  readonly name: string;
  /** The volume as last read (`create`, `refresh`); undefined until then. */
  info: VolumeInfo | undefined;
  readonly #transport: Transport;

  /** A handle on the volume `name` (`airlock.volumes.get` makes them). An upload is written
   * whole or not at all: `VolumeFullError` when it does not fit, `VolumeBusyError` while
   * another writer holds the volume. */
  constructor(transport: Transport, name: string) {
    super(transport, volumePath(name));
    this.#transport = transport;
    this.name = name;
  }

  /** The mount that puts this volume at `path` (absolute, below `/work` or `/tmp`), for the
   * `volumes` of a run, a stream, a background execution or a session. */
  mount(path: string, options: { readOnly?: boolean | undefined } = {}): VolumeMount {
    if (typeof path !== "string" || !path.startsWith("/")) throw new TypeError(`a mount's path is absolute: ${JSON.stringify(path)}`);
    return { name: this.name, path, read_only: options.readOnly ?? false };
  }

  /** The volume as the server holds it now, with `used_bytes` and `used_entries`. */
  async refresh(options: CallOptions = {}): Promise<VolumeInfo> {
    const answer = await this.#transport.request({ method: "GET", path: volumePath(this.name) }, "json", options);
    this.info = toInfo(answer.body, "$");
    return this.info;
  }

  /** Every entry of the volume (links listed, never followed). */
  async files(options: CallOptions = {}): Promise<VolumeFiles> {
    const body = await this.listFiles(options);
    return { files: body.files as VolumeFileEntry[], truncated: body["truncated"] === true };
  }

  /** Removes a file, a link (never its target) or an empty directory. */
  remove(path: string, options: CallOptions = {}): Promise<void> {
    return this.removeFile(path, options);
  }

  /** Deletes the volume and everything in it. `VolumeInUseError` (naming the holders) while
   * an execution, a session or a file request holds it. */
  async delete(options: CallOptions = {}): Promise<void> {
    await this.#transport.request({ method: "DELETE", path: volumePath(this.name), ok: [204] }, "none", options);
  }
}

function volumePath(name: string): string {
  return `/v1/volumes/${segment(name, "a volume name")}`;
}

function toInfo(value: unknown, where: string): VolumeInfo {
  const body = object(value, where);
  if (typeof body["name"] !== "string") expected(`${where}.name`, "a string");
  if (typeof body["size_bytes"] !== "number") expected(`${where}.size_bytes`, "a number");
  return body as unknown as VolumeInfo;
}
