// A tiny harness for the compatibility scripts: named checks, each bounded in time,
// one line per check on stdout ("PASS name" / "FAIL name: why"), exit code 1 if any failed.
export const connection = {
  host: process.env.BQ_HOST ?? '127.0.0.1',
  port: Number(process.env.BQ_PORT ?? 6789),
  commandTimeout: 20_000,
};
/** The queue of each role, chosen by the test so that the node connected to leads none of them. */
export const queues: Record<string, string> = JSON.parse(process.env.BQ_QUEUES ?? '{}');

export function queue(role: string): string {
  const name = queues[role];
  if (!name) throw new Error(`no queue for role ${role} in BQ_QUEUES`);
  return name;
}

let failures = 0;

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

export function assert(condition: unknown, message: string): asserts condition {
  if (!condition) throw new Error(message);
}

export function equal(actual: unknown, expected: unknown, what: string): void {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Error(`${what}: got ${a}, expected ${e}`);
}

/** Wait for `condition` to hold, polling every 50 ms, at most `timeoutMs`. */
export async function until(condition: () => Promise<boolean> | boolean, what: string, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await condition()) return;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}

export async function check(name: string, body: () => Promise<void>, timeoutMs = 60_000): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const limit = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`check took longer than ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    await Promise.race([body(), limit]);
    console.log(`PASS ${name}`);
  } catch (error) {
    failures++;
    console.log(`FAIL ${name}: ${error instanceof Error ? error.stack ?? error.message : String(error)}`);
  } finally {
    clearTimeout(timer);
  }
}

export function finish(): never {
  console.log(failures ? `${failures} checks failed` : 'all checks passed');
  process.exit(failures ? 1 : 0);
}
