"""Journal benchmark: append + fdatasync throughput and latency, batched syncs, recovery time.

    python bench/bench_journal.py [--dir DIR] [--entries 2000] [--partitions 8]
                                  [--recovery-records 1000000] [--recovery-payload 117]
                                  [--recovery-bytes 1000000000] [--drop-caches] [--blocks 10]
                                  [--only NAME]

Runs on real files under ``--dir`` (default: a temporary directory under /tmp,
on the machine's disk) and prints, for entries of ~7 KB (a 50-push batch of
~117-byte jobs), 4 KiB and 64 KiB:

- ``per-entry``: each entry appended and fdatasync'ed before the next (a lone
  PUSH): entries/s and the append+sync latency p50/p99;
- ``batched``: every loop iteration appends one entry to each of
  ``--partitions`` journals, then one :class:`SyncBatcher` round syncs them all
  — serially (``sync_all``) and concurrently on a thread pool
  (``sync_all_threads``) — and, for comparison, the same entries appended to
  one node-wide journal with one sync per round: entries/s and round latency
  p50/p99 (what a reply waits);
- ``mark``: what protecting the newest synced batch costs the sync path: the
  journal as it is (each batch flushed with its copy, the mark written without
  a flush), the same journal making the synced mark durable after each sync
  instead of copying (a second fdatasync), and (a floor) neither: one journal
  synced on the calling thread, and ``--partitions`` journals synced together
  on threads, one ~7 KB entry each per round, the three interleaved in
  ``--blocks`` blocks so load hits them alike;
- ``recovery``: time to open a journal of ``--recovery-records`` records of
  ``--recovery-payload`` bytes, and of ``--recovery-bytes`` bytes of ~7 KB
  records, with the memory the open journal holds. ``--drop-caches`` (root)
  drops the page cache first, so the scan reads from the disk.

Every loop is bounded by ``--entries``; count sync calls with
``strace -f -c -e trace=fsync,fdatasync python bench/bench_journal.py --only per-entry``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from shoal.node.raft._io import RealIO
from shoal.node.raft.journal import Journal, SyncBatcher

SIZES = {"7 KB (50 x 117 B jobs)": 50 * 140, "4 KiB": 4096, "64 KiB": 65536}


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def per_entry(root: str, entries: int) -> None:
    print("\n== per-entry: append + fdatasync of each entry")
    for label, size in SIZES.items():
        d = os.path.join(root, f"per-{size}")
        j = Journal(RealIO(disk_free_min_bytes=0), d)
        payload = os.urandom(size)
        lat = []
        t0 = time.perf_counter()
        for i in range(1, entries + 1):
            s = time.perf_counter()
            j.append(i, 1, payload)
            j.sync()
            lat.append(time.perf_counter() - s)
        took = time.perf_counter() - t0
        j.close()
        shutil.rmtree(d)
        print(f"{label:>24}: {entries / took:8.0f} entries/s {entries * size / took / 1e6:7.1f} MB/s"
              f"  p50 {pct(lat, 0.5) * 1e3:.3f} ms  p99 {pct(lat, 0.99) * 1e3:.3f} ms"
              f"  ({j.syncs} syncs for {entries} entries)")


def batched(root: str, entries: int, partitions: int, blocks: int = 5) -> None:
    print(f"\n== batched: one entry into each of {partitions} partitions per round, one sync round"
          f" (modes interleaved in {blocks} blocks)")
    rounds = max(1, entries // partitions // blocks)
    modes = ("serial", "threads", "one journal")
    with ThreadPoolExecutor(partitions) as pool:
        for label, size in SIZES.items():
            payload = os.urandom(size)
            lat: dict[str, list[float]] = {m: [] for m in modes}
            busy: dict[str, float] = dict.fromkeys(modes, 0.0)
            syncs: dict[str, int] = dict.fromkeys(modes, 0)
            journals = {}
            batchers = {}
            for mode in modes:
                batchers[mode] = SyncBatcher()
                count = 1 if mode == "one journal" else partitions
                journals[mode] = [Journal(RealIO(disk_free_min_bytes=0),
                                          os.path.join(root, f"batch-{size}", mode.replace(" ", "-"), f"p{k}"),
                                          batcher=batchers[mode]) for k in range(count)]
            done = dict.fromkeys(modes, 0)
            for _ in range(blocks):
                for mode in modes:
                    js, batcher = journals[mode], batchers[mode]
                    t0 = time.perf_counter()
                    for _ in range(rounds):
                        s = time.perf_counter()
                        i = done[mode] = done[mode] + 1
                        if mode == "one journal":  # a node-wide journal: every partition's entry, one sync
                            for k in range(partitions):
                                js[0].append((i - 1) * partitions + k + 1, 1, payload)
                        else:
                            for j in js:
                                j.append(i, 1, payload)
                        if mode == "threads":
                            batcher.sync_all_threads(pool)
                        else:
                            batcher.sync_all()
                        lat[mode].append(time.perf_counter() - s)
                    busy[mode] += time.perf_counter() - t0
            for mode in modes:
                syncs[mode] = sum(j.syncs for j in journals[mode])
                for j in journals[mode]:
                    j.close()
                n = done[mode] * partitions
                print(f"{label:>24} {mode:>11}: {n / busy[mode]:8.0f} entries/s"
                      f" {n * size / busy[mode] / 1e6:7.1f} MB/s"
                      f"  round p50 {pct(lat[mode], 0.5) * 1e3:.3f} ms  p99 {pct(lat[mode], 0.99) * 1e3:.3f} ms"
                      f"  ({syncs[mode]} syncs, {done[mode]} rounds)")
            shutil.rmtree(os.path.join(root, f"batch-{size}"))


def mark(root: str, entries: int, partitions: int, blocks: int, entry_bytes: int = 50 * 140) -> None:
    for count in (1, partitions):
        how = "on the calling thread" if count == 1 else "together on threads"
        print(f"\n== mark: {count} journal(s), one {entry_bytes:,}-byte entry each per round, synced {how}; with copies,"
              f" with a durable mark instead, and with neither (interleaved in {blocks} blocks)")
        mark_rounds(os.path.join(root, f"mark-{count}"), entries, count, blocks, entry_bytes)


def mark_rounds(root: str, entries: int, partitions: int, blocks: int, entry_bytes: int) -> None:
    rounds = max(1, entries // partitions // blocks)
    payload = os.urandom(entry_bytes)
    modes = ("copies", "durable mark", "neither")
    lat: dict[str, list[float]] = {m: [] for m in modes}
    busy = dict.fromkeys(modes, 0.0)
    cpu = dict.fromkeys(modes, 0.0)  # this process's CPU time (user + system, every thread)
    with ThreadPoolExecutor(partitions) as pool:
        batchers = {m: SyncBatcher() for m in modes}
        journals = {m: [Journal(RealIO(disk_free_min_bytes=0), os.path.join(root, m.replace(" ", "-"), f"p{k}"),
                                batcher=batchers[m], zeros_ahead=True) for k in range(partitions)] for m in modes}
        for j in journals["durable mark"] + journals["neither"]:
            j.copy_bytes_max = 0  # no copies: each sync makes the synced mark durable
        for j in journals["neither"]:
            j._mark_ready = False  # the journal's switch for the mark's write after each sync
        done = 0
        for _ in range(blocks):
            for mode in modes:
                t0, c0 = time.perf_counter(), time.process_time()
                for r in range(rounds):
                    s = time.perf_counter()
                    for j in journals[mode]:
                        j.append(done + r + 1, 1, payload)
                    if partitions == 1:
                        batchers[mode].sync_all()
                    else:
                        batchers[mode].sync_all_threads(pool)
                    lat[mode].append(time.perf_counter() - s)
                busy[mode] += time.perf_counter() - t0
                cpu[mode] += time.process_time() - c0
            done += rounds
        for mode in modes:
            syncs = sum(j.syncs for j in journals[mode])
            for j in journals[mode]:
                j.close()
            n = done * partitions
            print(f"{mode:>14}: {n / busy[mode]:8.0f} entries/s  round p50 {pct(lat[mode], 0.5) * 1e3:.3f} ms"
                  f"  p99 {pct(lat[mode], 0.99) * 1e3:.3f} ms  cpu {cpu[mode] / done * 1e6:.0f} us/round"
                  f"  ({done} rounds, {syncs} fdatasyncs)")
    shutil.rmtree(root)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def recovery(root: str, records: int, payload_bytes: int, drop: bool) -> None:
    d = os.path.join(root, f"recovery-{records}-{payload_bytes}")
    j = Journal(RealIO(disk_free_min_bytes=0), d)
    payload = os.urandom(payload_bytes)
    t0 = time.perf_counter()
    for i in range(1, records + 1):
        j.append(i, 1 + i // 100_000, payload)
    j.close()
    wrote = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
    if drop:
        drop_caches()
    t0 = time.perf_counter()
    j = Journal(RealIO(disk_free_min_bytes=0), d)
    took = time.perf_counter() - t0
    assert j.last_index == records
    mem = j.memory_bytes()
    segments = len([n for n in os.listdir(d) if n.endswith(".wal")])
    j.close()
    shutil.rmtree(d)
    cache = "cold cache" if drop else "warm cache"
    print(f"{records:>9} records x {payload_bytes:>5} B = {size / 1e6:7.1f} MB in {segments} segments: "
          f"written in {wrote:.2f} s, recovered in {took:.2f} s ({records / took:,.0f} records/s, "
          f"{size / took / 1e6:.0f} MB/s, {cache}); journal memory after open {mem / 1e6:.1f} MB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="directory for the journals (default: a temp dir under /tmp)")
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--recovery-records", type=int, default=1_000_000)
    ap.add_argument("--recovery-payload", type=int, default=117)
    ap.add_argument("--recovery-bytes", type=int, default=1_000_000_000)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--blocks", type=int, default=10, help="interleaved blocks of the mark comparison")
    ap.add_argument("--mark-bytes", type=int, default=50 * 140, help="payload of each entry of the mark comparison")
    ap.add_argument("--only", choices=["per-entry", "batched", "mark", "recovery"], default=None)
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench-journal-", dir=args.dir)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus, "
          f"load average {load}, journals under {root}")
    try:
        if args.only in (None, "per-entry"):
            per_entry(root, args.entries)
        if args.only in (None, "batched"):
            batched(root, args.entries, args.partitions)
        if args.only in (None, "mark"):
            mark(root, args.entries, args.partitions, args.blocks, args.mark_bytes)
        if args.only in (None, "recovery"):
            print("\n== recovery: open (scan + CRC check of every record) of a closed journal")
            recovery(root, args.recovery_records, args.recovery_payload, args.drop_caches)
            big = 50 * 140
            recovery(root, max(1, args.recovery_bytes // (big + 24)), big, args.drop_caches)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
