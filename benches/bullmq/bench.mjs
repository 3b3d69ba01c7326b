// BullMQ running the workloads of `trioqueue bench` (same names, same JSON shape), so that
// benches/bench_vs_bullmq.py can put both side by side from one run on one server.
//   node bench.mjs --url redis://127.0.0.1:PORT [--jobs 20000] [--concurrency 100]
//                  [--payload-bytes 52] [--workloads A-seq,...] [--json out.json]
import { Queue, Worker, QueueEvents } from "bullmq";
import IORedis from "ioredis";
import { writeFileSync } from "node:fs";
import { randomBytes } from "node:crypto";

const WORKLOADS = ["A-seq", "A-100", "A-batch", "B", "B-1ms", "C-1", "C-50"];

function parseArgs(argv) {
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
  for (const w of out.workloads) if (!WORKLOADS.includes(w)) throw new Error(`unknown workload ${w}`);
  return out;
}

const args = parseArgs(process.argv.slice(2));
const u = new URL(args.url);
// in native ESM BullMQ takes constructed clients: one per Queue/Worker/QueueEvents, as its defaults would
const conn = () => new IORedis({ host: u.hostname, port: parseInt(u.port || "6379", 10), maxRetriesPerRequest: null });
const payload = { d: "x".repeat(args.payloadBytes - '{"d":""}'.length) };
const runId = randomBytes(4).toString("hex");
const now = () => Number(process.hrtime.bigint()) / 1e9;
const pct = (xs, p) => {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};
// like trioqueue's result TTL: finished jobs are kept for a while, not forever
const jobOpts = { removeOnComplete: { age: 120 }, removeOnFail: { age: 120 } };

function queueOf(w) {
  return new Queue(`bench-${runId}-${w}`, { connection: conn() });
}

async function enqueueSeq() {
  const q = queueOf("A-seq");
  const t0 = now();
  for (let i = 0; i < args.jobs; i++) await q.add("j", payload, { ...jobOpts, jobId: `s${i}` });
  const s = now() - t0;
  await q.close();
  return { workload: "A-seq", jobs: args.jobs, seconds: s, rate: args.jobs / s };
}

async function enqueueConcurrent(tasks = 100) {
  const q = queueOf("A-100");
  const per = Math.max(1, Math.floor(args.jobs / tasks));
  const t0 = now();
  await Promise.all(
    Array.from({ length: tasks }, async (_, k) => {
      for (let i = 0; i < per; i++) await q.add("j", payload, { ...jobOpts, jobId: `c${k}-${i}` });
    }),
  );
  const s = now() - t0;
  await q.close();
  return { workload: "A-100", jobs: per * tasks, seconds: s, rate: (per * tasks) / s };
}

async function enqueueBatch(size = 1000) {
  const q = queueOf("A-batch");
  const items = Array.from({ length: args.jobs }, (_, i) => ({ name: "j", data: payload, opts: { ...jobOpts, jobId: `b${i}` } }));
  const t0 = now();
  for (let s = 0; s < items.length; s += size) await q.addBulk(items.slice(s, s + size));
  const s = now() - t0;
  await q.close();
  return { workload: "A-batch", jobs: args.jobs, seconds: s, rate: args.jobs / s };
}

async function processing(w, processor) {
  const q = queueOf(w);
  const n = args.jobs;
  const items = Array.from({ length: n }, (_, i) => ({ name: "j", data: payload, opts: { ...jobOpts, jobId: `p${i}` } }));
  for (let s = 0; s < n; s += 1000) await q.addBulk(items.slice(s, s + 1000));
  let count = 0;
  let t0;
  const finished = new Promise((resolve) => {
    t0 = now();
    const worker = new Worker(q.name, processor, { connection: conn(), concurrency: args.concurrency });
    worker.on("completed", () => {
      if (++count === n) resolve(worker);
    });
  });
  const worker = await finished;
  const s = now() - t0;
  await worker.close();
  await q.close();
  return { workload: w, jobs: n, seconds: s, rate: n / s, extra: { concurrency: args.concurrency } };
}

async function requestResponse(w, callers) {
  const q = queueOf(w);
  q.setMaxListeners(0); // every waitUntilFinished listens until its job ends
  const events = new QueueEvents(q.name, { connection: conn() });
  events.setMaxListeners(0);
  await events.waitUntilReady();
  const worker = new Worker(q.name, async () => null, { connection: conn(), concurrency: Math.max(callers, args.concurrency) });
  await worker.waitUntilReady();
  const n = Math.max(callers, Math.floor(args.jobs / (callers === 1 ? 20 : 4)));
  const per = Math.floor(n / callers);
  const lat = [];
  const t0 = now();
  await Promise.all(
    Array.from({ length: callers }, async (_, k) => {
      for (let i = 0; i < per; i++) {
        const t = now();
        const job = await q.add("j", payload, { ...jobOpts, jobId: `w${k}-${i}` });
        await job.waitUntilFinished(events, 60000);
        lat.push(now() - t);
      }
    }),
  );
  const s = now() - t0;
  await worker.close();
  await events.close();
  await q.close();
  return {
    workload: w, jobs: lat.length, seconds: s, rate: lat.length / s,
    p50_ms: pct(lat, 50) * 1000, p99_ms: pct(lat, 99) * 1000, extra: { callers },
  };
}

const RUN = {
  "A-seq": enqueueSeq,
  "A-100": () => enqueueConcurrent(),
  "A-batch": () => enqueueBatch(),
  B: () => processing("B", async () => null),
  "B-1ms": () => processing("B-1ms", () => new Promise((r) => setTimeout(r, 1))),
  "C-1": () => requestResponse("C-1", 1),
  "C-50": () => requestResponse("C-50", 50),
};

const results = [];
for (const w of args.workloads) {
  const r = await RUN[w]();
  results.push({ p50_ms: null, p99_ms: null, extra: {}, ...r });
  console.error(`${w}: ${Math.round(r.rate)}/s`);
}
const doc = {
  tool: "bullmq", version: "6.7.0", storage: args.url, node: process.version,
  time: new Date().toISOString(), jobs: args.jobs, concurrency: args.concurrency,
  payload_bytes: args.payloadBytes, results,
};
if (args.json) writeFileSync(args.json, JSON.stringify(doc, null, 2));
else console.log(JSON.stringify(doc, null, 2));
process.exit(0);
