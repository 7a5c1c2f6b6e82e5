// The rest of the client calls bunqueue's README documents, against one address.
import { Queue, Worker } from 'bunqueue/client';
import { assert, check, connection, equal, finish, queue, sleep, until } from './_harness';

const reset = async (role: string): Promise<Queue> => {
  const q = new Queue(queue(role), { connection });
  await q.obliterateAsync();
  return q;
};

await check('priorities: the highest first', async () => {
  const q = await reset('order');
  for (const priority of [1, 10, 5]) await q.add(`p${priority}`, { priority }, { priority });
  const worker = new Worker(queue('order'), null as never, { connection, autorun: false });
  const names: string[] = [];
  for (let i = 0; i < 3; i++) {
    const job = await worker.getNextJob();
    assert(job !== undefined, 'a job');
    names.push(job.name);
    await q.moveJobToCompleted(job.id, 'done', job.token);
  }
  equal(names, ['p10', 'p5', 'p1'], 'pull order');
  equal(await q.getCompletedCount(), 3, 'completed');
  await worker.close();
  q.close();
});

await check('listings and counts', async () => {
  const q = await reset('lists');
  const plain = await q.add('plain', { i: 1 });
  const urgent = await q.add('urgent', { i: 2 }, { priority: 4 });
  const later = await q.add('later', { i: 3 }, { delay: 60_000 });
  equal((await q.getWaitingAsync()).map((j) => j.id), [plain.id], 'waiting');
  equal((await q.getPrioritized()).map((j) => j.id), [urgent.id], 'prioritized');
  equal((await q.getDelayedAsync()).map((j) => j.id), [later.id], 'delayed');
  equal((await q.getJobsAsync({ state: 'delayed' })).map((j) => j.id), [later.id], 'getJobs delayed');
  const counts = await q.getJobCountsAsync();
  equal([counts.waiting, counts.prioritized, counts.delayed, counts.active], [1, 1, 1, 0], 'counts');
  equal(await q.getWaitingCount(), 1, 'getWaitingCount');
  equal(await q.getDelayedCount(), 1, 'getDelayedCount');
  equal(await q.countAsync(), 3, 'count');
  equal(await q.getCountsPerPriorityAsync(), { 0: 2, 4: 1 }, 'counts per priority (waiting and delayed)');
  equal(await q.getJobState(later.id), 'delayed', 'state of the delayed job');
  await q.promoteJob(later.id);
  equal(await q.getJobState(later.id), 'waiting', 'state once promoted');
  q.close();
});

await check('pause, resume, remove, drain, clean, obliterate', async () => {
  const q = await reset('control');
  await q.pauseAsync();
  equal(await q.isPausedAsync(), true, 'paused');
  const worker = new Worker(queue('control'), async () => 'ran', { connection });
  const a = await q.add('a', {});
  await sleep(300);
  equal(await q.getJobState(a.id), 'waiting', 'a paused queue hands out nothing');
  await q.resumeAsync();
  equal(await q.isPausedAsync(), false, 'resumed');
  await until(async () => (await q.getJobState(a.id)) === 'completed', 'the job to run once resumed');
  await worker.close();
  const b = await q.add('b', {});
  await q.removeAsync(b.id);
  equal(await q.getJob(b.id), null, 'removed');
  await q.addBulk([{ name: 'x', data: {} }, { name: 'y', data: {} }]);
  equal(await q.drainAsync(), 2, 'drained');
  equal(await q.countAsync(), 0, 'nothing left to run');
  const cleaned = await q.cleanAsync(0, 100, 'completed');
  equal(cleaned, [a.id], 'cleaned completed jobs');
  await q.add('z', {});
  await q.obliterateAsync();
  equal((await q.getJobCountsAsync()).waiting, 0, 'obliterated');
  q.close();
});

await check('job schedulers', async () => {
  const q = await reset('sched');
  const info = await q.upsertJobScheduler('every-hour', { every: 3_600_000 }, { name: 'tick', data: { t: 1 } });
  assert(info !== null, 'upsert returned null');
  equal(info.id, 'every-hour', 'scheduler id');
  assert(info.next > Date.now(), `next run ${info.next}`);
  const pattern = await q.upsertJobScheduler('nightly', { pattern: '0 3 * * *' }, { name: 'nightly' });
  assert(pattern !== null, 'a cron pattern scheduler');
  const all = (await q.getJobSchedulers()).map((s) => s.id).sort();
  equal(all, ['every-hour', 'nightly'], 'schedulers');
  equal(await q.getJobSchedulersCount(), 2, 'scheduler count');
  equal((await q.getJobScheduler('every-hour'))?.id, 'every-hour', 'getJobScheduler');
  equal(await q.removeJobScheduler('every-hour'), true, 'removed');
  equal(await q.removeJobScheduler('nightly'), true, 'removed');
  equal(await q.getJobSchedulersCount(), 0, 'none left');
  const ran: unknown[] = [];
  const worker = new Worker(queue('sched'), async (job) => { ran.push([job.name, job.data]); }, { connection });
  const fast = await q.upsertJobScheduler('fast', { every: 300 }, { name: 'fast', data: { f: 1 } });
  assert(fast !== null, 'a fast scheduler');
  await until(() => ran.length >= 2, 'the scheduler to add two jobs', 15_000);
  equal(ran[0], ['fast', { f: 1 }], 'a scheduled job');
  await q.removeJobScheduler('fast');
  await worker.close();
  q.close();
});

await check('dead-letter queue', async () => {
  const q = await reset('dlq');
  const worker = new Worker(queue('dlq'), async () => { throw new Error('always broken'); }, { connection });
  const job = await q.add('doomed', { d: 1 }, { attempts: 2, backoff: 10 });
  await until(async () => (await q.getFailedCount()) === 1, 'the job to be dead-lettered');
  await worker.close();
  const entries = await q.getDlqAsync();
  equal(entries.map((e) => e.job.id), [job.id], 'DLQ entries');
  equal(entries[0].error, 'always broken', 'DLQ error');
  equal(entries[0].reason, 'max_attempts_exceeded', 'DLQ reason');
  equal((await q.getDlqAsync({ reason: 'stalled' })).length, 0, 'filtered by reason');
  const stats = await q.getDlqStatsAsync();
  equal(stats.total, 1, 'DLQ total');
  equal(stats.byReason.max_attempts_exceeded, 1, 'DLQ by reason');
  equal((await q.getFailedAsync()).map((j) => j.id), [job.id], 'getFailed');
  equal(await q.retryDlqAsync(job.id), 1, 'retried one');
  equal(await q.getJobState(job.id), 'waiting', 'back to waiting');
  const worker2 = new Worker(queue('dlq'), async () => { throw new Error('still broken'); }, { connection });
  await until(async () => (await q.getFailedCount()) === 1, 'the job to fail again');
  await worker2.close();
  equal(await q.purgeDlqAsync(), 1, 'purged');
  equal(await q.getFailedCount(), 0, 'DLQ empty');
  q.close();
});

await check('global concurrency and rate limit', async () => {
  const q = await reset('limits');
  await q.setGlobalConcurrencyAsync(2);
  equal(await q.getGlobalConcurrency(), 2, 'concurrency');
  await q.setGlobalRateLimitAsync(50, 1000);
  equal(await q.getGlobalRateLimit(), { max: 50, duration: 1000 }, 'rate limit');
  await q.addBulk(Array.from({ length: 6 }, (_, n) => ({ name: 'slow', data: { n } })));
  let running = 0;
  let most = 0;
  const worker = new Worker(queue('limits'), async () => {
    running++;
    most = Math.max(most, running);
    await sleep(100);
    running--;
  }, { connection, concurrency: 6 });
  await until(async () => (await q.getCompletedCount()) === 6, 'the jobs to complete');
  assert(most <= 2, `at most 2 jobs ran at once, saw ${most}`);
  await worker.close();
  await q.removeGlobalConcurrencyAsync();
  await q.removeGlobalRateLimitAsync();
  equal(await q.getGlobalConcurrency(), null, 'no concurrency limit');
  equal(await q.getGlobalRateLimit(), null, 'no rate limit');
  q.close();
});

await check('a Worker without locks: progress, logs, updates, retries with backoff', async () => {
  const q = await reset('nolocks');
  const progress: unknown[] = [];
  const worker = new Worker(queue('nolocks'), async (job) => {
    await job.updateProgress(40);
    await job.log(`working on ${job.name}`);
    await job.updateProgress(100);
    if (job.attemptsMade === 0) throw new Error('first try fails');
    return job.data;
  }, { connection, useLocks: false, concurrency: 3 });
  worker.on('progress', (_job, value) => progress.push(value));
  const failed: string[] = [];
  worker.on('failed', (job, error) => failed.push(`${job?.id}:${error.message}`));
  const job = await q.add('logged', { keep: 'me' }, { attempts: 2, backoff: { type: 'fixed', delay: 50 } });
  await until(async () => (await q.getJobState(job.id)) === 'completed', 'the job to complete');
  equal(failed, [`${job.id}:first try fails`], 'failed events');
  const logs = await q.getJobLogs(job.id);
  equal(logs.count, 2, 'log lines');
  assert(logs.logs[0].includes('working on logged'), `log line ${logs.logs[0]}`);
  equal((await q.getJob(job.id))?.progress, 100, 'progress');
  equal((await q.getJob(job.id))?.returnvalue, { keep: 'me' }, 'returnvalue');
  await q.clearJobLogs(job.id);
  equal((await q.getJobLogs(job.id)).count, 0, 'logs cleared');
  await worker.close();
  const waiting = await q.add('edit', { v: 1 }, { delay: 60_000 });
  await q.updateJobData(waiting.id, { v: 2 });
  await q.changeJobPriority(waiting.id, { priority: 9 });
  const edited = await q.getJob(waiting.id);
  equal([edited?.data, edited?.priority], [{ v: 2 }, 9], 'data and priority');
  q.close();
});

await check('moveToCompleted and moveToFailed by hand', async () => {
  const q = await reset('manual');
  await q.add('first', { n: 1 });
  await q.add('second', { n: 2 }, { attempts: 1 });
  const worker = new Worker(queue('manual'), null as never, { connection, autorun: false });
  const one = await worker.getNextJob();
  assert(one !== undefined, 'first job');
  await q.moveJobToCompleted(one.id, { ok: true }, one.token);
  const two = await worker.getNextJob();
  assert(two !== undefined, 'second job');
  await q.moveJobToFailed(two.id, new Error('by hand'), two.token);
  equal(await q.getJobState(one.id), 'completed', 'first completed');
  equal((await q.getJob(one.id))?.returnvalue, { ok: true }, 'first result');
  equal(await q.getJobState(two.id), 'failed', 'second failed');
  equal((await q.getJob(two.id))?.failedReason, 'by hand', 'second error');
  await worker.close();
  q.close();
});

await check('custom job ids', async () => {
  const q = await reset('custom');
  const job = await q.add('mine', { c: 1 }, { jobId: 'order-42' });
  equal(job.id, 'order-42', 'the job id is the custom id');
  const again = await q.add('mine', { c: 2 }, { jobId: 'order-42' });
  equal(again.id, 'order-42', 'the same id adds nothing');
  equal(await q.countAsync(), 1, 'one job');
  equal((await q.getJob('order-42'))?.data, { c: 1 }, 'found by its id');
  const worker = new Worker(queue('custom'), async (j) => `done ${j.id}`, { connection });
  await until(async () => (await q.getJobState('order-42')) === 'completed', 'the job to complete');
  equal((await q.getJob('order-42'))?.returnvalue, 'done order-42', 'result');
  await worker.close();
  q.close();
});

await check('add with the legacy repeat option', async () => {
  const q = await reset('repeat');
  const first = await q.add('tick', { t: 1 }, { repeat: { every: 200, limit: 2 } });
  equal((await q.getJob(first.id))?.name, 'tick', 'the first job, added now');
  equal(await q.getJobState(first.id), 'waiting', 'waiting');
  const runs: string[] = [];
  const worker = new Worker(queue('repeat'), async (job) => {
    runs.push(`${job.name} ${JSON.stringify(job.data)}`);
  }, { connection });
  await until(async () => (await q.getJobCountsAsync()).completed === 3, 'three runs');
  await until(async () => (await q.getJobSchedulersCount()) === 0, 'the schedule to end with its limit');
  equal(runs, Array(3).fill('tick {"t":1}'), 'the job, then two more');
  await worker.close();
  q.close();
});

await check('a batch Worker: size, minimum size, timeout, one job failed alone', async () => {
  const q = await reset('batch');
  await q.addBulk(Array.from({ length: 10 }, (_, i) => ({ name: 'b', data: { i }, opts: { attempts: 1 } })));
  const sizes: number[] = [];
  const worker = new Worker(queue('batch'), async (job) => {
    const batch = job.getBatch();
    sizes.push(batch.length);
    for (const member of batch) if ((member.data as { i: number }).i === 3) member.setAsFailed(new Error('three'));
    return 'ok';
  }, { connection, batch: { size: 4, minSize: 2, timeout: 200 } });
  await until(async () => {
    const counts = await q.getJobCountsAsync();
    return counts.completed === 9 && counts.failed === 1;
  }, 'nine completed, one failed');
  assert(sizes.every((n) => n >= 2 && n <= 4), `batch sizes ${sizes}`);
  equal(sizes.reduce((a, b) => a + b, 0), 10, 'every job in one batch');
  await worker.close();
  q.close();
});

finish();
