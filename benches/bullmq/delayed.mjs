// BullMQ's delayed jobs, the twin of benches/bench_delayed.py's trioqueue side: a producer
// adds `--rate` jobs a second for `--seconds` seconds, each delayed by a draw from
// [--min-delay-ms, --max-delay-ms] (seeded, the same draws as the Python side), to a Worker
// (concurrency 100) in this process whose processor records its lateness: the time it
// starts minus the job's due time (both on this machine's clock, sub-millisecond).
//   node delayed.mjs --url redis://127.0.0.1:PORT --json out.json [--rate 1000] [--seconds 5]
import { writeFileSync } from "node:fs";
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";
import { newRunId, payloadOf } from "./common.mjs";

const opts = { url: "redis://127.0.0.1:6379", rate: 1000, seconds: 5, minDelayMs: 50, maxDelayMs: 500, json: null, concurrency: 100 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i += 2) {
  const k = argv[i].replace(/^--/, "").replace(/-([a-z])/g, (_, c) => c.toUpperCase());
  if (!(k in opts)) throw new Error(`unknown option ${argv[i]}`);
  opts[k] = typeof opts[k] === "number" ? Number(argv[i + 1]) : argv[i + 1];
}
const u = new URL(opts.url);
const conn = () => new IORedis({ host: u.hostname, port: parseInt(u.port || "6379", 10), maxRetriesPerRequest: null });
const wall = () => performance.timeOrigin + performance.now(); // ms since the epoch, sub-ms
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// the same draws as bench_delayed.py: a linear congruential generator, seed 1
let seed = 1;
const draw = () => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed / 2147483648;
};

const n = Math.round(opts.rate * opts.seconds);
const name = `delayed-${newRunId()}`;
const q = new Queue(name, { connection: conn() });
const late = [];
let done;
const finished = new Promise((r) => (done = r));
const worker = new Worker(
  name,
  async (job) => {
    late.push(wall() - job.data.due);
    if (late.length === n) done();
    return null;
  },
  { connection: conn(), concurrency: opts.concurrency },
);
await worker.waitUntilReady();
const pad = payloadOf(52).d;
const t0 = wall();
for (let k = 0; k < n; k++) {
  const at = t0 + (k * 1000) / opts.rate;
  const wait = at - wall();
  if (wait > 1) await sleep(wait);
  const delay = Math.round(opts.minDelayMs + draw() * (opts.maxDelayMs - opts.minDelayMs));
  const due = wall() + delay;
  await q.add("j", { due, d: pad }, { delay, jobId: `d${k}`, removeOnComplete: { age: 120 } });
}
const produced = (wall() - t0) / 1000;
await finished;
await worker.close();
await q.close();
const doc = { tool: "bullmq", version: "6.7.0", node: process.version, jobs: n, rate: opts.rate, produced_s: produced, lateness_ms: late };
if (opts.json) writeFileSync(opts.json, JSON.stringify(doc));
else console.log(JSON.stringify(doc));
process.exit(0);
