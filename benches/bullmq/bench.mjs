// BullMQ running the workloads of `trioqueue bench` (same names, same JSON shape), so that
// benches/bench_vs_bullmq.py can put both side by side from one run on one server.
//   node bench.mjs --url redis://127.0.0.1:PORT [--jobs 20000] [--concurrency 100]
//                  [--payload-bytes 52] [--workloads A-seq,...] [--json out.json]
import { Queue, Worker, QueueEvents } from "bullmq";
import IORedis from "ioredis";
import { parseArgs, payloadOf, newRunId, now, RESULT_TTL_S, runAll, runCallers } from "./common.mjs";

const args = parseArgs(process.argv.slice(2));
const u = new URL(args.url);
// in native ESM BullMQ takes constructed clients: one per Queue/Worker/QueueEvents, as its defaults would
const conn = () => new IORedis({ host: u.hostname, port: parseInt(u.port || "6379", 10), maxRetriesPerRequest: null });
const payload = payloadOf(args.payloadBytes);
const runId = newRunId();
const jobOpts = { removeOnComplete: { age: RESULT_TTL_S }, removeOnFail: { age: RESULT_TTL_S } };

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
  const r = await runCallers(w, callers, args.jobs, async (id) => {
    const job = await q.add("j", payload, { ...jobOpts, jobId: id });
    await job.waitUntilFinished(events, 60000);
  });
  await worker.close();
  await events.close();
  await q.close();
  return r;
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

await runAll(args, RUN, { tool: "bullmq", version: "6.7.0" });
