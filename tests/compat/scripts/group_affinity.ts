// bunqueue's batch Worker with groupAffinity, against one address: after a batch's first job its
// pulls name that job's group (PULLB group: {affinity}), so every batch fills from one group.
// The test creates the queue with groupConcurrency 0 first (Shoal runs one job per group unless
// told otherwise; a batch of five needs five of a group at once).
import { Queue, Worker } from 'bunqueue/client';
import { assert, check, connection, equal, finish, queue, until } from './_harness';

const GROUPS = ['tenant-a', 'tenant-b', 'tenant-c'];
const PER_GROUP = 10;
const PLAIN = 5;

await check('a batch Worker with groupAffinity: each batch of one group, each job once', async () => {
  const q = new Queue(queue('affinity'), { connection });
  const jobs = GROUPS.flatMap((g) => Array.from({ length: PER_GROUP }, (_, i) => (
    { name: 'deliver', data: { g, i }, opts: { group: { id: g }, attempts: 1 } })));
  jobs.push(...Array.from({ length: PLAIN }, (_, i) => ({ name: 'deliver', data: { g: '', i }, opts: { attempts: 1 } })));
  await q.addBulk(jobs);
  const batches: string[][] = [];
  const seen = new Set<string>();
  let twice = 0;
  const worker = new Worker(queue('affinity'), async (job) => {
    const batch = job.getBatch();
    const keys = batch.map((member) => {
      const { g, i } = member.data as { g: string; i: number };
      return `${g}/${i}`;
    });
    for (const key of keys) {
      if (seen.has(key)) twice++;
      seen.add(key);
    }
    batches.push(keys);
    return 'ok';
  }, { connection, batch: { size: 5, minSize: 5, timeout: 3_000, groupAffinity: true } });
  const total = GROUPS.length * PER_GROUP + PLAIN;
  await until(async () => (await q.getJobCountsAsync()).completed === total, 'every job completed', 45_000);
  await worker.close();
  equal(twice, 0, 'jobs processed twice');
  equal(seen.size, total, 'jobs processed');
  for (const keys of batches) {
    const groups = new Set(keys.map((key) => key.split('/')[0]));
    assert(groups.size === 1, `a batch of one group: ${keys}`);
  }
  // With the pulls limited to the batch's group every batch fills to its size at once; a node
  // refusing them would leave each batch its first job alone after the timeout.
  equal(batches.map((keys) => keys.length), Array(total / 5).fill(5), 'batch sizes');
  q.close();
}, 90_000);

finish();
