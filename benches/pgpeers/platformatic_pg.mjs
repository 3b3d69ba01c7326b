// @platformatic/job-queue with its PgStorage running the workloads of `trioqueue bench` on
// PostgreSQL (same names, same JSON shape), for benches/bench_postgres_peers.py.
//   node platformatic_pg.mjs --url postgresql://... [--jobs 5000] [--concurrency 100]
//                            [--payload-bytes 52] [--workloads A-seq,...] [--json out.json]
//
// Where its API makes a workload differ (as in benches/bullmq/platformatic.mjs):
// - A-batch: there is no batch enqueue, so it is skipped; B fills its queue with 5
//   concurrent `enqueue` calls (not timed): with 100 at once, as on Redis, the fill stopped
//   after 10 jobs here (the storage's pool holds 10 connections) and never went on;
// - handlers return true (a null result reads as "no result stored yet" to enqueueAndWait);
// - C-50 is skipped: 50 concurrent `enqueueAndWait` calls stalled as the fill above did (an
//   enqueue holds a pooled connection while it asks the pool for another, to publish);
// - no Reaper; each workload gets a PgStorage of its own (table prefix per workload).
// - The package declares engines node >= 22.19 (Promise.withResolvers); on older Node the
//   standard polyfill below is installed.
import { readFileSync } from "node:fs";
import { Queue, PgStorage } from "@platformatic/job-queue";
import { parseArgs, payloadOf, newRunId, now, RESULT_TTL_S, runAll, runCallers } from "../bullmq/common.mjs";

if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function withResolvers() {
    let resolve, reject;
    const promise = new this((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}

const VERSION = JSON.parse(readFileSync(new URL("./node_modules/@platformatic/job-queue/package.json", import.meta.url))).version;
const args = parseArgs(process.argv.slice(2));
const payload = payloadOf(args.payloadBytes);
const runId = newRunId();
const jobOpts = { resultTTL: RESULT_TTL_S * 1000 };
const RESULT = true;

async function queueOf(w, config = {}) {
  const storage = new PgStorage({ connectionString: args.url, tablePrefix: `b${runId}_${w.replace("-", "_").toLowerCase()}_` });
  const q = new Queue({ storage, resultTTL: RESULT_TTL_S * 1000, ...config });
  q.on("error", (e) => {
    console.error(`${w}: queue error: ${e.stack ?? e}`);
    process.exit(1);
  });
  return q;
}

async function enqueueOne(q, id) {
  const r = await q.enqueue(id, payload, jobOpts);
  if (r.status !== "queued") throw new Error(`enqueue ${id}: ${r.status}`);
}

async function enqueueSeq() {
  const q = await queueOf("A-seq");
  await q.start();
  const t0 = now();
  for (let i = 0; i < args.jobs; i++) await enqueueOne(q, `s${i}`);
  const s = now() - t0;
  await q.stop();
  return { workload: "A-seq", jobs: args.jobs, seconds: s, rate: args.jobs / s };
}

async function enqueueFrom(q, tasks, per, prefix) {
  await Promise.all(
    Array.from({ length: tasks }, async (_, k) => {
      for (let i = 0; i < per; i++) await enqueueOne(q, `${prefix}${k}-${i}`);
    }),
  );
}

async function processing(w) {
  const n = args.jobs;
  const producer = await queueOf(w);
  await producer.start();
  await enqueueFrom(producer, 5, Math.floor(n / 5), "p"); // no batch API; not timed
  await enqueueFrom(producer, 1, n % 5, "q");
  await producer.stop();
  let count = 0;
  let done;
  const finished = new Promise((resolve, reject) => {
    done = { resolve, reject };
  });
  const t0 = now();
  const consumer = await queueOf(w, { concurrency: args.concurrency });
  consumer.on("completed", () => {
    if (++count === n) done.resolve();
  });
  consumer.on("failed", (id, e) => done.reject(new Error(`${w}: job ${id} failed: ${e}`)));
  consumer.execute(async () => RESULT);
  await consumer.start();
  await finished;
  const s = now() - t0;
  await consumer.stop();
  return { workload: w, jobs: n, seconds: s, rate: n / s, extra: { concurrency: args.concurrency } };
}

async function requestResponse(w, callers) {
  const q = await queueOf(w, { concurrency: Math.max(callers, args.concurrency) });
  q.execute(async () => RESULT);
  await q.start();
  const r = await runCallers(w, callers, args.jobs, (id) => q.enqueueAndWait(id, payload, { ...jobOpts, timeout: 60000 }));
  await q.stop();
  return r;
}

const RUN = {
  "A-seq": enqueueSeq,
  B: () => processing("B"),
  "C-1": () => requestResponse("C-1", 1),
};

await runAll(args, RUN, { tool: "@platformatic/job-queue (PgStorage)", version: VERSION }, {
  timeoutS: 300,
  skipped: {
    "A-batch": "no batch enqueue API",
    "C-50": "stalls: more concurrent calls than the storage's 10 pooled connections (an enqueue holds one while it asks for another)",
  },
});
