// What bench.mjs (BullMQ) and platformatic.mjs (@platformatic/job-queue) share, so that both
// take the same options and write the same JSON shape as `trioqueue bench --json`.
import { writeFileSync } from "node:fs";
import { randomBytes } from "node:crypto";

export const WORKLOADS = ["A-seq", "A-100", "A-batch", "B", "B-1ms", "C-1", "C-50"];
// Run only when named (--workloads): B with batch handlers, for the peers that have them.
export const OPTIONAL_WORKLOADS = ["B-batch"];

export function parseArgs(argv) {
  const out = { url: "redis://127.0.0.1:6379", jobs: 20000, concurrency: 100, payloadBytes: 52, workloads: WORKLOADS, json: null };
  for (let i = 0; i < argv.length; i += 2) {
    const [k, v] = [argv[i], argv[i + 1]];
    if (v === undefined) throw new Error(`missing value for ${k}`);
    if (k === "--url") out.url = v;
    else if (k === "--jobs") out.jobs = parseInt(v, 10);
    else if (k === "--concurrency") out.concurrency = parseInt(v, 10);
    else if (k === "--payload-bytes") out.payloadBytes = parseInt(v, 10);
    else if (k === "--workloads") out.workloads = v.split(",").map((s) => s.trim()).filter(Boolean);
    else if (k === "--json") out.json = v;
    else throw new Error(`unknown option ${k}`);
  }
  for (const w of out.workloads) if (!WORKLOADS.includes(w) && !OPTIONAL_WORKLOADS.includes(w)) throw new Error(`unknown workload ${w}`);
  return out;
}

// a JSON object serializing to `bytes` bytes, like trioqueue's payload_of_size
export const payloadOf = (bytes) => ({ d: "x".repeat(bytes - '{"d":""}'.length) });
export const newRunId = () => randomBytes(4).toString("hex");
export const now = () => Number(process.hrtime.bigint()) / 1e9;
export const pct = (xs, p) => {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};
// the result of a request/response workload: `lat` latencies (s) over `s` seconds
export const latencyResult = (w, lat, s, callers) => ({
  workload: w, jobs: lat.length, seconds: s, rate: lat.length / s,
  p50_ms: pct(lat, 50) * 1000, p99_ms: pct(lat, 99) * 1000, extra: { callers },
});
// a request/response workload: `callers` loops at once, each sending its share of
// max(callers, jobs / 20 (one caller) or / 4) requests one after another, timed one by one
export async function runCallers(w, callers, jobs, request) {
  const n = Math.max(callers, Math.floor(jobs / (callers === 1 ? 20 : 4)));
  const per = Math.floor(n / callers);
  const lat = [];
  const t0 = now();
  await Promise.all(
    Array.from({ length: callers }, async (_, k) => {
      for (let i = 0; i < per; i++) {
        const t = now();
        await request(`w${k}-${i}`);
        lat.push(now() - t);
      }
    }),
  );
  return latencyResult(w, lat, now() - t0, callers);
}
// like trioqueue's result TTL in the bench: finished jobs are kept for a while, not forever
export const RESULT_TTL_S = 120;

// Runs the workloads in order (RUN[w] returns a result object, or null when the library has
// no equivalent: then it is left out and listed in `skipped`), prints a line per workload to
// stderr and writes the JSON document. `timeoutS` bounds each workload: a hang is an error.
export async function runAll(args, RUN, meta, { timeoutS = 600, skipped = {} } = {}) {
  const results = [];
  for (const w of args.workloads) {
    if (skipped[w]) {
      console.error(`${w}: skipped (${skipped[w]})`);
      continue;
    }
    let timer;
    const limit = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${w} did not finish in ${timeoutS} s`)), timeoutS * 1000);
    });
    const r = await Promise.race([RUN[w](), limit]);
    clearTimeout(timer);
    results.push({ p50_ms: null, p99_ms: null, extra: {}, ...r });
    console.error(`${w}: ${Math.round(r.rate)}/s`);
  }
  const doc = {
    ...meta, storage: args.url, node: process.version, time: new Date().toISOString(), jobs: args.jobs,
    concurrency: args.concurrency, payload_bytes: args.payloadBytes, results,
    ...(args.workloads.some((w) => skipped[w]) ? { skipped: Object.fromEntries(args.workloads.filter((w) => skipped[w]).map((w) => [w, skipped[w]])) } : {}),
  };
  if (args.json) writeFileSync(args.json, JSON.stringify(doc, null, 2));
  else console.log(JSON.stringify(doc, null, 2));
  process.exit(0);
}
