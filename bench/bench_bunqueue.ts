// One timed workload with bunqueue's client (run by bench_bunqueue.py, which reads the JSON line).
// BQ_HOST/BQ_PORT: the server; BQ_QUEUE: a fresh queue; BQ_WORKLOAD: bulk | single | drain.
// The client's connection pool: 4 connections, at most 100 commands in flight on each.
import { Queue, Worker } from 'bunqueue/client';

const connection = { host: process.env.BQ_HOST ?? '127.0.0.1', port: Number(process.env.BQ_PORT ?? 6789),
  poolSize: 4, maxInFlight: 100, commandTimeout: 60_000 };
const name = process.env.BQ_QUEUE ?? 'bench';
const workload = process.env.BQ_WORKLOAD ?? 'single';
const BULK_BATCHES = Number(process.env.BQ_BULK_BATCHES ?? 100);
const BULK_SIZE = Number(process.env.BQ_BULK_SIZE ?? 1000);
const SINGLES = Number(process.env.BQ_SINGLES ?? 20_000);
const DRAIN = Number(process.env.BQ_DRAIN ?? 50_000);
const LANES = 400; // 4 connections x 100 in flight
const payload = { to: 'user@example.com', subject: 'benchmark', n: 0 };

const queue = new Queue(name, { connection, autoBatch: { enabled: false } });
// BQ_KEEP_QUEUE=1: the queue was created fresh, with options, before this run (obliterating drops them)
if (process.env.BQ_KEEP_QUEUE !== '1') await queue.obliterateAsync();

async function lanes(total: number, width: number, one: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < total) {
      const i = next++;
      await one(i);
    }
  }));
}

let jobs = 0;
let seconds = 0;
if (workload === 'bulk') {
  const batch = Array.from({ length: BULK_SIZE }, (_, n) => ({ name: 'bulk', data: { ...payload, n } }));
  const start = performance.now();
  await lanes(BULK_BATCHES, 4, () => queue.addBulk(batch));
  seconds = (performance.now() - start) / 1000;
  jobs = BULK_BATCHES * BULK_SIZE;
} else if (workload === 'single') {
  const start = performance.now();
  await lanes(SINGLES, LANES, (n) => queue.add('single', { ...payload, n }));
  seconds = (performance.now() - start) / 1000;
  jobs = SINGLES;
} else if (workload === 'drain') {
  const batch = Array.from({ length: 1000 }, (_, n) => ({ name: 'drain', data: { ...payload, n } }));
  await lanes(DRAIN / 1000, 4, () => queue.addBulk(batch));
  let done = 0;
  let finished: () => void = () => undefined;
  const all = new Promise<void>((resolve) => { finished = resolve; });
  const start = performance.now();
  const worker = new Worker(name, async () => {
    if (++done === DRAIN) finished();
    return null;
  }, { connection, concurrency: 50, batchSize: 10 });
  await all;
  // every ack has reached the server once nothing is waiting or active any more (the completed
  // count may stop short of DRAIN: a server keeps a bounded history of completed jobs)
  for (;;) {
    const counts = await queue.getJobCountsAsync();
    if (counts.waiting + counts.prioritized + counts.active === 0) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  seconds = (performance.now() - start) / 1000;
  jobs = DRAIN;
  await worker.close();
} else {
  throw new Error(`unknown workload ${workload}`);
}
const counts = await queue.getJobCountsAsync();
console.log(JSON.stringify({ workload, jobs, seconds, rate: jobs / seconds, counts }));
await queue.obliterateAsync();
queue.close();
process.exit(0);
