// @platformatic/job-queue (RedisStorage) running the workloads of `trioqueue bench`: same
// names, options and JSON shape as bench.mjs, for benches/bench_vs_bullmq.py.
//   node platformatic.mjs --url redis://127.0.0.1:PORT [--jobs 20000] [--concurrency 100]
//                         [--payload-bytes 52] [--workloads A-seq,...] [--json out.json]
//
// Where its API makes a workload differ from trioqueue's / BullMQ's:
// - A-batch: there is no batch enqueue (only `enqueue(id, payload)`), so it is skipped;
//   B and B-1ms therefore fill their queue with 100 concurrent `enqueue` calls (not timed).
// - Handlers return true where trioqueue's and BullMQ's return None/null (see RESULT).
// - No Reaper runs (stalled-job recovery is a separate, optional object in this library);
//   trioqueue's B consumer runs without its reaper too.
// - Each workload gets a RedisStorage of its own (key prefix `bench-<run>-<workload>:`), not
//   a `name` namespace of one storage: namespaces share the root's single BLMOVE client, so
//   an idle consumer's blocking dequeue would stall the other queues' dequeues.
// - The package declares engines node >= 22.19 (Promise.withResolvers, used by
//   enqueueAndWait); on older Node the standard polyfill below is installed.
import { readFileSync } from "node:fs";
import { Queue, RedisStorage } from "@platformatic/job-queue";
import { parseArgs, payloadOf, newRunId, now, RESULT_TTL_S, runAll, runCallers } from "./common.mjs";

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
const jobOpts = { resultTTL: RESULT_TTL_S * 1000 }; // ms here
// The "noop" handlers return true, not null/undefined: a handler's result goes through
// JSON.stringify (undefined fails the job) and enqueueAndWait takes a null result for
// "no result stored" and keeps waiting until its timeout.
const RESULT = true;

// A queue on the workload's own storage; errors it reports (consumer loop, storage) fail the run.
async function queueOf(w, config = {}) {
  const q = new Queue({ storage: new RedisStorage({ url: args.url, keyPrefix: `bench-${runId}-${w}:` }), resultTTL: RESULT_TTL_S * 1000, ...config });
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

async function enqueueConcurrent(tasks = 100) {
  const q = await queueOf("A-100");
  await q.start();
  const per = Math.max(1, Math.floor(args.jobs / tasks));
  const t0 = now();
  await enqueueFrom(q, tasks, per, "c");
  const s = now() - t0;
  await q.stop();
  return { workload: "A-100", jobs: per * tasks, seconds: s, rate: (per * tasks) / s };
}

async function processing(w, handler) {
  const n = args.jobs;
  const producer = await queueOf(w);
  await producer.start();
  await enqueueFrom(producer, 100, Math.floor(n / 100), "p"); // no batch API; not timed
  await enqueueFrom(producer, 1, n % 100, "q");
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
  consumer.execute(handler);
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
  "A-100": () => enqueueConcurrent(),
  B: () => processing("B", async () => RESULT),
  "B-1ms": () => processing("B-1ms", () => new Promise((r) => setTimeout(() => r(RESULT), 1))),
  "C-1": () => requestResponse("C-1", 1),
  "C-50": () => requestResponse("C-50", 50),
};

await runAll(args, RUN, { tool: "@platformatic/job-queue", version: VERSION }, {
  timeoutS: 300,
  skipped: { "A-batch": "no batch enqueue API" },
});
