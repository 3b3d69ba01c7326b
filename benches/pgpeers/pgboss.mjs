// pg-boss running the workloads of `trioqueue bench` on PostgreSQL (same names, same JSON
// shape), for benches/bench_postgres_peers.py.
//   node pgboss.mjs --url postgresql://... [--jobs 5000] [--concurrency 100]
//                   [--payload-bytes 52] [--workloads A-seq,...] [--json out.json] [--no-notify]
//
// How the workloads map onto pg-boss's API:
// - every queue is created with `notify: true` and the instance with `useListenNotify`, so a
//   worker is woken by NOTIFY when a job is created (its fastest documented setup for latency);
//   `--no-notify`: neither (workers poll; an enqueue sends no NOTIFY, so its commit does
//   not wait for the other NOTIFYing commits);
// - `send` from 100 concurrent callers (the instance's pool: its default, 10);
// - A-batch: `insert(name, jobs)`, 1000 a call;
// - B: one `work()` with `localConcurrency` = --concurrency workers of one job each
//   (`batchSize: 1`), the same shape as trioqueue's B (--concurrency handlers of one job).
//   pg-boss fetches again at once only in burst mode, and at `batchSize: 1` only
//   `burstWhenReadyExceeds` turns it on (from the queue's ready count, cached by the
//   instance); so the instance refreshes its stats every second (the least it accepts) and
//   the workers burst while more than one job is ready, else poll every 0.5 s (the least).
// - B-batch: one `work()` with `batchSize` = --concurrency (100 jobs in flight, handed to the
//   handler as one array and completed together) and `burstWhenBatchFull` (fetch again at
//   once while batches come back full): pg-boss's high-throughput setup, beside trioqueue's
//   `batch_handler` with `batch_size` = --concurrency.
// - C-1 / C-50: pg-boss has no request/response call. The caller `send`s, learns in-process
//   that the handler ran (a hook this process owns: no database round trip) and then reads the
//   job (`getJobById`) every millisecond until it is stored completed. This favours pg-boss
//   (a waiter in another process would need a poll or a LISTEN of its own).
import { readFileSync } from "node:fs";
import { PgBoss } from "pg-boss";
import { parseArgs, payloadOf, newRunId, now, RESULT_TTL_S, runAll, runCallers } from "../bullmq/common.mjs";

const VERSION = JSON.parse(readFileSync(new URL("./node_modules/pg-boss/package.json", import.meta.url))).version;
const argv = process.argv.slice(2);
const NOTIFY = !argv.includes("--no-notify");
const args = parseArgs(argv.filter((a) => a !== "--no-notify"));
const payload = payloadOf(args.payloadBytes);
const runId = newRunId();
const boss = new PgBoss({
  connectionString: args.url,
  useListenNotify: NOTIFY,
  schedule: false,
  // (B's burst mode reads the ready count from these stats: refreshed as often as allowed)
  superviseIntervalSeconds: 1,
  monitorIntervalSeconds: 1,
  queueCacheIntervalSeconds: 1,
});
boss.on("error", (e) => {
  console.error(`pg-boss error: ${e.stack ?? e}`);
  process.exit(1);
});
await boss.start();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function queueOf(w) {
  const name = `bench-${runId}-${w}`;
  await boss.createQueue(name, { notify: NOTIFY, deleteAfterSeconds: RESULT_TTL_S });
  return name;
}

async function enqueueSeq() {
  const q = await queueOf("A-seq");
  const t0 = now();
  for (let i = 0; i < args.jobs; i++) await boss.send(q, payload);
  const s = now() - t0;
  return { workload: "A-seq", jobs: args.jobs, seconds: s, rate: args.jobs / s };
}

async function enqueueConcurrent(tasks = 100) {
  const q = await queueOf("A-100");
  const per = Math.max(1, Math.floor(args.jobs / tasks));
  const t0 = now();
  await Promise.all(
    Array.from({ length: tasks }, async () => {
      for (let i = 0; i < per; i++) await boss.send(q, payload);
    }),
  );
  const s = now() - t0;
  return { workload: "A-100", jobs: per * tasks, seconds: s, rate: (per * tasks) / s, extra: { notify: NOTIFY } };
}

async function enqueueBatch(size = 1000) {
  const q = await queueOf("A-batch");
  const t0 = now();
  for (let s = 0; s < args.jobs; s += size) {
    await boss.insert(q, Array.from({ length: Math.min(size, args.jobs - s) }, () => ({ data: payload })));
  }
  const s = now() - t0;
  return { workload: "A-batch", jobs: args.jobs, seconds: s, rate: args.jobs / s };
}

async function completedCount(q) {
  const r = await boss.getDb().executeSql("SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1 AND state = 'completed'", [q]);
  return r.rows[0].n;
}

const PROCESSING = {
  B: { localConcurrency: args.concurrency, batchSize: 1, burstWhenReadyExceeds: 1, pollingIntervalSeconds: 0.5, notifyPollingIntervalSeconds: 0.5 },
  "B-batch": { batchSize: args.concurrency, burstWhenBatchFull: true, pollingIntervalSeconds: 0.5 },
};

async function processing(w) {
  const q = await queueOf(w);
  const n = args.jobs;
  for (let s = 0; s < n; s += 1000) {
    await boss.insert(q, Array.from({ length: Math.min(1000, n - s) }, () => ({ data: payload })));
  }
  let handled = 0;
  const opts = PROCESSING[w];
  const t0 = now();
  await boss.work(q, opts, async (jobs) => {
    handled += jobs.length;
    return null;
  });
  while (handled < n) await sleep(5);
  while ((await completedCount(q)) < n) await sleep(5); // the last batch's completion is stored
  const s = now() - t0;
  await boss.offWork(q);
  return { workload: w, jobs: n, seconds: s, rate: n / s, extra: { concurrency: args.concurrency, mode: w === "B" ? "localConcurrency" : "batchSize" } };
}

async function requestResponse(w, callers) {
  const q = await queueOf(w);
  const ran = new Map(); // job id -> resolve(): the in-process hook of the handler
  await boss.work(q, { localConcurrency: Math.min(callers, 10), batchSize: Math.max(1, Math.ceil(callers / 10)), pollingIntervalSeconds: 0.5 }, async (jobs) => {
    for (const j of jobs) {
      const r = ran.get(j.id);
      if (r) r();
      else ran.set(j.id, null); // ran before the caller registered
    }
    return null;
  });
  const r = await runCallers(w, callers, args.jobs, async () => {
    const id = await boss.send(q, payload);
    if (!ran.has(id)) await new Promise((resolve) => ran.set(id, resolve));
    ran.delete(id);
    for (;;) {
      const job = await boss.getJobById(q, id);
      if (job && job.state === "completed") return;
      await sleep(1);
    }
  });
  await boss.offWork(q);
  return r;
}

const RUN = {
  "A-seq": enqueueSeq,
  "A-100": () => enqueueConcurrent(),
  "A-batch": () => enqueueBatch(),
  B: () => processing("B"),
  "B-batch": () => processing("B-batch"),
  "C-1": () => requestResponse("C-1", 1),
  "C-50": () => requestResponse("C-50", 50),
};

await runAll(args, RUN, { tool: NOTIFY ? "pg-boss" : "pg-boss (no notify)", version: VERSION }, {
  timeoutS: 600,
  skipped: { "B-1ms": "not part of the Postgres comparison" },
});
