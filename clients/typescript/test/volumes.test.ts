// Volumes against the real server: made, listed, shown, their files in and out byte for byte
// (bytes and streams), mounted into runs, streams, background executions and sessions, one
// writer at a time, and the refusals' error classes (quota, full, unknown, busy, in use).

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";

import {
  Airlock,
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  PayloadTooLargeError,
  QuotaExceededError,
  Volume,
  VolumeBusyError,
  VolumeFullError,
  VolumeInUseError,
} from "../src/index.js";
import { KEY, OTHER, VOLUME_QUOTA, launch, type Server } from "./harness.js";

const MIB = 1 << 20;

let server: Server;
let client: Airlock;

before(async () => {
  server = await launch();
  client = new Airlock({ baseUrl: server.url, apiKey: KEY });
});

after(async () => {
  await server.stop();
});

async function readAll(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

test("a volume keeps files across executions and the file routes, byte for byte", async () => {
  const data = await client.volumes.create("ts-data", 16 * MIB);
  try {
    assert.ok(data instanceof Volume);
    assert.equal(data.name, "ts-data");
    assert.equal(data.info?.size_bytes, 16 * MIB);
    await assert.rejects(client.volumes.create("ts-data", 16 * MIB), (e: unknown) => {
      assert.ok(e instanceof ConflictError);
      assert.equal(e.code, "conflict");
      return true;
    });
    const listed = (await client.volumes.list()).find((v) => v.name === "ts-data");
    assert.deepEqual([listed?.size_bytes, listed?.max_entries, listed?.used_bytes], [16 * MIB, 1024, undefined]);
    assert.ok(listed?.created_at);

    const every = new Uint8Array(256 * 16).map((_, i) => 255 - (i % 256));
    const big = new Uint8Array(randomBytes(3 * MIB + 7));
    await data.upload("in/greeting.txt", "héllo");
    await data.upload("raw.bin", every);
    await data.upload("big.bin", big);
    const code =
      "import os, hashlib\n" +
      "got = open('/work/data/in/greeting.txt').read()\n" +
      "open('/work/data/out.bin', 'wb').write(bytes([0xff, 0x00, 0xc3, 0x28]) * 1000)\n" +
      "[got, open('/work/data/raw.bin', 'rb').read()[:3].hex(), hashlib.sha256(open('/work/data/big.bin', 'rb').read()).hexdigest(), os.stat('/work/data/out.bin').st_uid]";
    const e = await client.run(code, { volumes: [data.mount("/work/data")] });
    assert.ok(e.ok, JSON.stringify(e.error));
    assert.deepEqual(e.result, ["héllo", "fffefd", createHash("sha256").update(big).digest("hex"), 1000]);
    // Written by the sandbox (bytes that are not UTF-8), read here whole and as a stream.
    const out = new Uint8Array(4000).map((_, i) => [0xff, 0x00, 0xc3, 0x28][i % 4] ?? 0);
    assert.deepEqual(await data.download("out.bin"), out);
    assert.deepEqual(await readAll(await data.downloadStream("out.bin")), out);
    assert.deepEqual(await data.download("raw.bin"), every);
    assert.deepEqual(await data.download("big.bin"), big);
    assert.deepEqual(await readAll(await data.downloadStream("big.bin")), big);
    // A handle made by name is the same volume; a stream uploads too.
    const same = client.volumes.get("ts-data");
    assert.equal(new TextDecoder().decode(await same.download("in/greeting.txt")), "héllo");
    await same.upload("copy.bin", await data.downloadStream("big.bin"));
    assert.deepEqual(await data.download("copy.bin"), big);

    const listing = await data.files();
    assert.equal(listing.truncated, false);
    assert.deepEqual(
      listing.files.map((f) => f.path),
      ["big.bin", "copy.bin", "in", "in/greeting.txt", "out.bin", "raw.bin"],
    );
    assert.deepEqual(listing.files.find((f) => f.path === "raw.bin"), { path: "raw.bin", type: "file", size: every.length });
    assert.equal(listing.files.find((f) => f.path === "in")?.type, "dir");
    const info = await client.volumes.show("ts-data");
    assert.deepEqual([info.name, info.size_bytes, info.max_entries, info.used_entries], ["ts-data", 16 * MIB, 1024, 6]);
    assert.ok((info.used_bytes ?? 0) > 6 * MIB);
    assert.equal((await data.refresh()).used_entries, 6);

    // Streams, function mode, background executions and sessions mount volumes too;
    // read-only is read-only.
    const reading = [data.mount("/tmp/ro", { readOnly: true })];
    assert.deepEqual(reading[0], { name: "ts-data", path: "/tmp/ro", read_only: true });
    assert.equal((await client.stream("print(open('/tmp/ro/in/greeting.txt').read())", { volumes: reading }).result()).stdout, "héllo\n");
    const refused = await client.run(
      "import errno\ntry:\n    open('/tmp/ro/new', 'w')\n    r = 'wrote'\nexcept OSError as e:\n    r = errno.errorcode[e.errno]\nr",
      { volumes: reading },
    );
    assert.equal(refused.result, "EROFS");
    const size = "def size(path):\n    import os\n    return os.path.getsize(path)";
    assert.equal(await client.call(size, "size", { path: "/work/d/raw.bin" }, { volumes: [data.mount("/work/d")] }), every.length);
    const job = await client.submit("open('/work/bg/from-bg.txt', 'w').write('bg')", { volumes: [data.mount("/work/bg")] });
    assert.ok((await job.wait()).ok);
    await job.cancel();
    assert.equal(new TextDecoder().decode(await data.download("from-bg.txt")), "bg");
    const s = await client.session({ volumes: [data.mount("/work/v")] });
    try {
      assert.equal((await s.run("open('/work/v/from-bg.txt').read()")).result, "bg");
    } finally {
      await s.close();
    }

    await data.remove("copy.bin");
    await data.remove("in/greeting.txt");
    await data.remove("in");
    await assert.rejects(data.download("copy.bin"), NotFoundError);
    assert.deepEqual((await data.files()).files.map((f) => f.path), ["big.bin", "from-bg.txt", "out.bin", "raw.bin"]);
    // Another key sees none of it.
    const other = new Airlock({ baseUrl: server.url, apiKey: OTHER });
    await assert.rejects(other.volumes.show("ts-data"), NotFoundError);
    await assert.rejects(other.volumes.get("ts-data").download("raw.bin"), NotFoundError);
  } finally {
    await data.delete();
  }
  assert.ok(!(await client.volumes.list()).some((v) => v.name === "ts-data"));
  await assert.rejects(data.refresh(), NotFoundError);
});

test("a volume has one writer, and is not deleted while held", async () => {
  const shared = await client.volumes.create("ts-shared", 8 * MIB, { max_entries: 64 });
  try {
    assert.equal(shared.info?.max_entries, 64);
    const s = await client.session({ volumes: [shared.mount("/work/shared")] });
    try {
      assert.ok((await s.run("open('/work/shared/by-session.txt', 'w').write('kept')")).ok);
      // A second writer, by a run, a session or an upload, is refused naming the holder.
      await assert.rejects(client.run("1", { volumes: [shared.mount("/work/shared")] }), (e: unknown) => {
        assert.ok(e instanceof VolumeBusyError);
        assert.ok(e instanceof ConflictError);
        assert.deepEqual([e.status, e.code, e.field], [409, "volume_busy", "volumes[0].name"]);
        assert.match(e.message, new RegExp(s.id));
        return true;
      });
      await assert.rejects(client.session({ volumes: [shared.mount("/work/shared")] }), VolumeBusyError);
      await assert.rejects(shared.upload("x.txt", "x"), VolumeBusyError);
      // Readers share it with its writer.
      const reader = await client.run("open('/work/v/by-session.txt').read()", { volumes: [shared.mount("/work/v", { readOnly: true })] });
      assert.equal(reader.result, "kept");
      await assert.rejects(shared.delete(), (e: unknown) => {
        assert.ok(e instanceof VolumeInUseError);
        assert.deepEqual([e.status, e.code], [409, "volume_in_use"]);
        assert.match(e.message, new RegExp(s.id));
        return true;
      });
    } finally {
      await s.close();
    }
    // Closed, the session holds it no more.
    await shared.upload("x.txt", "x");
    assert.equal(new TextDecoder().decode(await shared.download("by-session.txt")), "kept");
  } finally {
    await client.volumes.delete("ts-shared");
  }
  await assert.rejects(shared.refresh(), NotFoundError);
});

test("a volume's refusals have their error classes", async () => {
  await assert.rejects(client.volumes.create("ts-huge", VOLUME_QUOTA + 8 * MIB), (e: unknown) => {
    assert.ok(e instanceof QuotaExceededError);
    assert.ok(e instanceof PayloadTooLargeError);
    assert.deepEqual([e.status, e.code], [413, "quota_exceeded"]);
    return true;
  });
  await assert.rejects(client.volumes.create("ts-small", MIB), (e: unknown) => e instanceof InvalidRequestError && e.field === "size_bytes");
  await assert.rejects(client.volumes.create("Not A Name", 8 * MIB), (e: unknown) => e instanceof InvalidRequestError && e.field === "name");
  assert.ok(!(await client.volumes.list()).some((v) => ["ts-huge", "ts-small"].includes(v.name)));

  const missing = client.volumes.get("ts-missing");
  for (const use of [
    () => missing.refresh(),
    () => missing.files(),
    () => missing.delete(),
    () => missing.download("a"),
    () => missing.downloadStream("a"),
    () => missing.upload("a", ""),
    () => missing.remove("a"),
  ]) {
    await assert.rejects(use(), (e: unknown) => e instanceof NotFoundError && e.status === 404);
  }
  await assert.rejects(client.run("1", { volumes: [missing.mount("/work/m")] }), (e: unknown) => e instanceof NotFoundError && e.field === "volumes[0].name");

  const tiny = await client.volumes.create("ts-tiny", 8 * MIB);
  try {
    await assert.rejects(tiny.upload("big.bin", new Uint8Array(12 * MIB)), (e: unknown) => {
      assert.ok(e instanceof VolumeFullError);
      assert.ok(e instanceof PayloadTooLargeError);
      assert.deepEqual([e.status, e.code], [413, "volume_full"]);
      return true;
    });
    assert.deepEqual((await tiny.files()).files, [], "nothing of it left");
    await assert.rejects(client.run("1", { volumes: [tiny.mount("/usr/t")] }), (e: unknown) => e instanceof InvalidRequestError && e.field === "volumes[0].path");
    // Refused here, before any request.
    await assert.rejects(tiny.download("../etc/passwd"), TypeError);
    assert.throws(() => client.volumes.get(".."), TypeError);
    assert.throws(() => tiny.mount("work/t"), TypeError);
  } finally {
    await tiny.delete();
  }
});
