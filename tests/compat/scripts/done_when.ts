// The "Done when" script: bunqueue's client, unmodified, against one address.
import { FlowProducer, Queue, QueueEvents, Worker } from 'bunqueue/client';
import { assert, check, connection, equal, finish, queue, until } from './_harness';

const WORKER_QUEUES = ['w0', 'w1', 'w2', 'w3', 'w4', 'w5'];
const JOBS_PER_QUEUE = 100;

await check('add and addBulk', async () => {
  const q = new Queue(queue('basic'), { connection });
  await q.obliterateAsync();
  const job = await q.add('greet', { to: 'alice' }, { priority: 3 });
  assert(typeof job.id === 'string' && job.id.length > 0, `add returned id ${job.id}`);
  equal(job.name, 'greet', 'job name');
  const bulk = await q.addBulk([
    { name: 'one', data: { n: 1 } },
    { name: 'two', data: { n: 2 }, opts: { priority: 7 } },
  ]);
  equal(bulk.length, 2, 'bulk jobs');
  const counts = await q.getJobCountsAsync();
  equal(counts.waiting + counts.prioritized, 3, 'waiting + prioritized');
  q.close();
});

await check('getJob returns the job as added', async () => {
  const q = new Queue(queue('basic'), { connection });
  const added = await q.add('lookup', { deep: { list: [1, 2, 3] } }, { attempts: 4 });
  const job = await q.getJob(added.id);
  assert(job !== null, 'getJob returned null');
  equal(job.id, added.id, 'id');
  equal(job.name, 'lookup', 'name');
  equal(job.data, { deep: { list: [1, 2, 3] } }, 'data');
  equal(job.opts.attempts, 4, 'opts.attempts');
  equal(job.attemptsMade, 0, 'attemptsMade');
  equal(await job.getState(), 'waiting', 'state');
  assert(typeof job.timestamp === 'number' && job.timestamp > 1e12, `timestamp ${job.timestamp}`);
  equal(await q.getJob('no-such-job'), null, 'a missing job');
  q.close();
});

await check('a Worker completes 100 jobs on each of six queues', async () => {
  const qs = WORKER_QUEUES.map((role) => new Queue(queue(role), { connection }));
  for (const q of qs) await q.obliterateAsync();
  const done = new Map<string, Set<string>>();
  const workers = WORKER_QUEUES.map((role) => {
    const name = queue(role);
    done.set(name, new Set());
    return new Worker(name, async (job) => {
      done.get(name)!.add(String(job.id));
      return { doubled: (job.data as { n: number }).n * 2 };
    }, { connection, concurrency: 5 });
  });
  for (const q of qs) {
    await q.addBulk(Array.from({ length: JOBS_PER_QUEUE }, (_, n) => ({ name: 'work', data: { n } })));
  }
  await until(async () => {
    const counts = await Promise.all(qs.map((q) => q.getCompletedCount()));
    return counts.every((c) => c >= JOBS_PER_QUEUE);
  }, 'every queue to complete its jobs', 45_000);
  for (const q of qs) {
    equal(done.get(q.name)!.size, JOBS_PER_QUEUE, `jobs processed on ${q.name}`);
    const counts = await q.getJobCountsAsync();
    equal([counts.waiting, counts.active, counts.failed], [0, 0, 0], `waiting/active/failed of ${q.name}`);
  }
  const sample = (await qs[0].getCompletedAsync(0, 1))[0];
  assert(sample !== undefined, 'a completed job');
  const full = await qs[0].getJob(sample.id);
  equal(full?.returnvalue, { doubled: (full?.data as { n: number }).n * 2 }, 'returnvalue');
  await Promise.all(workers.map((w) => w.close()));
  for (const q of qs) q.close();
}, 90_000);

await check('a job that fails twice completes on its third attempt', async () => {
  const q = new Queue(queue('retry'), { connection });
  await q.obliterateAsync();
  const attempts: number[] = [];
  const worker = new Worker(queue('retry'), async (job) => {
    attempts.push(job.attemptsMade);
    if (job.attemptsMade < 2) throw new Error(`attempt ${job.attemptsMade + 1} fails`);
    return 'third time lucky';
  }, { connection });
  const added = await q.add('flaky', {}, { attempts: 3, backoff: 10 });
  await until(async () => (await q.getJobState(added.id)) === 'completed', 'the job to complete');
  equal(attempts, [0, 1, 2], 'attemptsMade at each attempt');
  const job = await q.getJob(added.id);
  equal(job?.returnvalue, 'third time lucky', 'returnvalue');
  equal(job?.attemptsMade, 2, 'attemptsMade once completed');
  assert((job?.stacktrace ?? []).length > 0, 'the last failure keeps its stack trace');
  await worker.close();
  q.close();
});

await check("QueueEvents receives a 'completed' event", async () => {
  const name = queue('events');
  const q = new Queue(name, { connection });
  await q.obliterateAsync();
  const events = new QueueEvents(name, { connection });
  await events.waitUntilReady();
  const seen = new Map<string, unknown>();
  events.on('completed', ({ jobId, returnvalue }) => { seen.set(jobId, returnvalue); });
  const worker = new Worker(name, async (job) => ({ echo: job.data }), { connection });
  const added = await q.add('ping', { hello: 'world' });
  await until(() => seen.has(added.id), "the 'completed' event");
  equal(seen.get(added.id), { echo: { hello: 'world' } }, 'the event returnvalue');
  await worker.close();
  events.close();
  q.close();
});

await check('a parent with two children (FlowProducer): the parent runs last, under its own name', async () => {
  const flows = new FlowProducer({ connection });
  const parentQ = new Queue(queue('flow-parent'), { connection });
  const childQ = new Queue(queue('flow-child'), { connection });
  await parentQ.obliterateAsync();
  await childQ.obliterateAsync();
  const tree = await flows.add({
    name: 'assemble', queueName: queue('flow-parent'), data: { order: 7 },
    children: [
      { name: 'part', queueName: queue('flow-child'), data: { part: 'a' } },
      { name: 'part', queueName: queue('flow-child'), data: { part: 'b' } },
    ],
  });
  equal(tree.children?.length, 2, 'children');
  equal(await parentQ.getJobState(tree.job.id), 'waiting-children', 'parent state before its children');
  equal((await parentQ.getJob(tree.job.id))?.name, 'assemble', "the parent's name");
  const ran: string[] = [];
  const childWorker = new Worker(queue('flow-child'), async (job) => {
    ran.push(job.name);
    return `made ${(job.data as { part: string }).part}`;
  }, { connection });
  const parentWorker = new Worker(queue('flow-parent'), async (job) => {
    ran.push(job.name);
    const values = await job.getChildrenValues();
    return Object.values(values).sort();
  }, { connection });
  await until(async () => (await parentQ.getJobState(tree.job.id)) === 'completed', 'the parent to complete');
  equal(ran, ['part', 'part', 'assemble'], 'the jobs run, by name');
  const parent = await parentQ.getJob(tree.job.id);
  equal(parent?.returnvalue, ['made a', 'made b'], "the parent's result from its children");
  for (const child of tree.children ?? []) {
    equal(await childQ.getJobState(child.job.id), 'completed', `child ${child.job.id}`);
  }
  await childWorker.close();
  await parentWorker.close();
  await flows.close();
  parentQ.close();
  childQ.close();
});

finish();
