// Decoding a 10 MB DataFrame answer: the JSON text as the server sends it (an execution whose
// result is a table of 100 000 cells, the most the sandbox sends as a table), parsed and
// decoded, against JSON.parse alone on the same text. `npm run bench`.

import { decode, parseJson } from "../src/index.js";

const ROWS = 20_000;

/** An answer of ROWS rows of five columns, as the sandbox writes it; with `bigIds`, int64 ids
 * past 2^53 (which JSON.parse would round) send the text to parseJson's own parser. */
function answer(bigIds: boolean): string {
  const records: string[] = [];
  for (let i = 0; i < ROWS; i++) {
    const id = bigIds ? 9_007_199_254_740_993n + BigInt(i) * 7919n : BigInt(i * 7919);
    const price = i % 1000 === 0 ? '{"$airlock": "float", "value": "nan"}' : String((i * 1.37) / 3);
    const name = `customer ${i} ` + "lorem ipsum dolor sit amet ".repeat(11);
    const day = String((i % 28) + 1).padStart(2, "0");
    const when = `{"$airlock": "datetime", "type": "pandas._libs.tslibs.timestamps.Timestamp", "iso": "2024-02-${day}T03:04:05.123456"}`;
    records.push(`{"id": ${id}, "name": ${JSON.stringify(name)}, "price": ${price}, "when": ${when}, "vip": ${i % 3 === 0}}`);
  }
  const index = Array.from({ length: ROWS }, (_, i) => i).join(", ");
  const result =
    '{"$airlock": "dataframe", "columns": ["id", "name", "price", "when", "vip"], ' +
    `"index": [${index}], "dtypes": ["int64", "object", "float64", "datetime64[ns]", "bool"], ` +
    `"records": [${records.join(", ")}]}`;
  return `{"id": "ex_0123456789abcdef", "status": "ok", "stdout": "", "stderr": "", "result": ${result}, ` +
    '"outputs": [], "files": [], "duration_ms": 812}';
}

function median(runs: number, work: () => void): number {
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const start = performance.now();
    work();
    times.push(performance.now() - start);
  }
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)] as number;
}

const RUNS = 9;
for (const bigIds of [false, true]) {
  const text = answer(bigIds);
  let sink: unknown;
  // One of each first, so that neither is timed cold.
  sink = decode((parseJson(text) as { result: unknown }).result);
  sink = JSON.parse(text);
  const baseline = median(RUNS, () => {
    sink = JSON.parse(text);
  });
  const parse = median(RUNS, () => {
    sink = parseJson(text);
  });
  const raw = parseJson(text) as { result: unknown };
  const decodeOnly = median(RUNS, () => {
    sink = decode(raw.result);
  });
  const both = median(RUNS, () => {
    sink = decode((parseJson(text) as { result: unknown }).result);
  });
  void sink;
  const mb = (new TextEncoder().encode(text).length / 1e6).toFixed(1);
  console.log(
    `${mb} MB DataFrame answer, ${ROWS} rows x 5 columns, ${bigIds ? "int64 ids past 2^53 (parseJson's own parser)" : "no integer past 2^53 (JSON.parse)"}:\n` +
      `  JSON.parse alone         ${baseline.toFixed(1)} ms\n` +
      `  parseJson                ${parse.toFixed(1)} ms\n` +
      `  decode (parsed)          ${decodeOnly.toFixed(1)} ms\n` +
      `  parseJson + decode       ${both.toFixed(1)} ms  (median of ${RUNS}, node ${process.version})`,
  );
}
