"""PUSH, PUSHB and group-committed PushMany: new jobs, segments of plain jobs, log records, dedupe."""

from __future__ import annotations

import heapq
import sys
from array import array
from typing import Any

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError, ErrorCode

from ._model import IDEMPOTENCY_WINDOW_MS, Job, Queue, due_key, ready_key, slot_like
from ._commands import PushBatch, PushRun
from ._decimal import joined_decimal_run
from ._forwarded import FORWARDED_FORMS, first_form, first_sends_only
from ._idempotency import IdempotencyWindow
from ._key_table import key_hash
from ._segments import SEGMENT_SLOTS_MAX, SLOT_DELAYED, SLOT_READY, SLOT_WAITING, Segment, split_plain
from ._store import Store
from ._transitions import ACTIVE, DELAYED, NEW, WAITING, check_transition

__all__ = ["PushOps"]

# The moves a new job makes (fixed ends), checked against the table when the engine loads.
check_transition(NEW, WAITING)
check_transition(NEW, DELAYED)


class PushOps(IdempotencyWindow):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def _check_log_capacity(self, q: Queue, adding: int) -> None:
        """A log queue's capacity counts its records (``discard: reject``: nothing is dropped)."""
        capacity = q.opts["capacity"]
        if capacity and len(q.log) + adding > capacity:
            raise CommandError(ErrorCode.QUEUE_FULL, f"queue {q.name!r} is at its capacity of {capacity}")

    def _check_push(self, q: Queue, options: dict[str, Any], extra: int = 0, group_ahead: int = 0) -> None:
        """Refuse an add ``q`` cannot take; ``extra``: jobs of the same batch added before it,
        ``group_ahead``: those of them in its group."""
        if q.type == "log":
            self._check_log_capacity(q, 1 + extra)
            return
        preset = q.preset
        group = options.get("group")
        if group is not None:
            if not preset["group"]:
                raise CommandError(ErrorCode.INVALID, f"group: queue {q.name!r} ({q.type}) has no groups")
            max_size = options.get("groupMaxSize")
            # bunqueue's group admission: at most maxSize jobs of the group wait (or are delayed),
            # counting this one; a flow's parent waits for its children, outside its group.
            if max_size is not None and q.group_sizes.get(group, 0) + group_ahead >= max_size \
                    and not options.get("_expect"):
                raise CommandError(ErrorCode.QUEUE_FULL, f"Group {group} has reached its maximum size of {max_size}")
        capacity = q.opts["capacity"]
        if capacity and preset["capacity"]:
            live = q.counts[WAITING] + q.counts[DELAYED] + q.counts[ACTIVE]
            if live + extra >= capacity:
                raise CommandError(ErrorCode.QUEUE_FULL, f"queue {q.name!r} is at its capacity of {capacity}")

    def _duplicate(self, q: Queue, options: dict[str, Any]) -> str | None:
        """The wire id of the job this add repeats (same idempotency key within the window, or
        same custom id), or None."""
        key = options.get("idempotencyKey")
        if key is not None:
            if key.startswith(FORWARDED_FORMS):
                earlier = self._forwarded_duplicate(key)  # type: ignore[attr-defined]  # ForwardedKeys
                if earlier is not None:
                    return self._wire_id_of(earlier)
            else:
                seq = self._key_seq(q.name, key)
                if seq is not None:
                    return self.wire_id_of_seq(seq)
        custom = options.get("customId")
        if custom is not None:
            seq = q.custom_ids.get(custom)
            if seq is not None and self._holds(seq):
                return custom
        return None

    def _wire_id_of(self, job_id: str) -> str:
        """The wire id of the job Shoal's id ``job_id`` names (its custom id, if it has one)."""
        seq = int(job_id.rpartition("-")[2]) if "-" in job_id else 0
        custom = self._custom_of(seq) if seq > 0 else None
        return custom if custom is not None else job_id

    def _note_key(self, queue: str, key: str | None, seq: int, now: int) -> None:
        """Keep the idempotency key (if any) of an add that made job ``seq`` of ``queue``: in the
        window, or with the forwarded keys when a forwarding node gave it."""
        if key is None:
            return
        if key.startswith(FORWARDED_FORMS):
            self._note_forwarded(seq, [first_form(key)])  # type: ignore[attr-defined]  # ForwardedKeys
        else:
            self._remember_key(queue, key, seq, now + IDEMPOTENCY_WINDOW_MS)

    def _new_job(self, q: Queue, data: Any, options: dict[str, Any]) -> Job:
        # The hottest function of a push (it runs on every replica): locals, one .get each.
        get = options.get
        preset = q.preset
        delay = ((get("delay") or 0) if preset["delay"] else 0) if len(options) > 1 else 0
        self.seq = seq = self.seq + 1
        opts = q.opts
        now = self.now_ms
        name = q.name
        events = self._events
        job = Job(seq, name, self._keep(data), (get("priority") or 0) if preset["priority"] else 0, now)
        job.max_attempts = get("attempts") or opts["attempts"]
        backoff = get("backoff")
        job.backoff_ms = opts["backoff"] if backoff is None else backoff
        job.ttr_ms = (get("ttr") if preset["ttr"] else None) or opts["ttr"]
        if len(options) > 1:  # anything beside ``data``
            job.name = shared(get("name"))
            job.group = shared(get("group"))
            job.custom_id = custom = get("customId")
            job.tag = shared(get("tag"))
            if custom is not None:
                q.custom_ids[custom] = seq
            meta = {k: options[k] for k in META_OPTIONS if options.get(k) is not None}
            if meta:
                job.meta = meta
            self._note_key(name, get("idempotencyKey"), seq, now)
        self.jobs[seq] = job
        q.totals["enqueued"] += 1
        if preset["ttl"]:
            ttl = get("ttl") or opts["ttl"]
            if ttl:
                job.ttl_deadline_ms = now + delay + ttl
                heapq.heappush(self.ttls, (job.ttl_deadline_ms, seq))
        if delay:
            if events is not None:
                events.append((name, seq, DELAYED, None))
            job.state = DELAYED
            q.counts[DELAYED] += 1
            job.run_at_ms = now + delay
            self.delayed.push(due_key(job.run_at_ms, seq))
            if job.group is not None:
                self._group_moved(q, job.group, NEW, DELAYED)  # type: ignore[attr-defined]  # ReadyIndex
        else:
            if events is not None:
                events.append((name, seq, WAITING, None))
            q.counts[WAITING] += 1
            prio = job.priority
            q.prio_counts[prio] = q.prio_counts.get(prio, 0) + 1
            if job.group is None:
                heapq.heappush(q.ready, ready_key(prio, seq))
            else:
                self._group_moved(q, job.group, NEW, WAITING)  # type: ignore[attr-defined]  # ReadyIndex
                self._enqueue_ready(q, job)
        return job

    def _push_segment(self, q: Queue, datas: list[Any], keys: list[str | None] | None,
                      per_item: bool = False, names: list[str | None] | None = None
                      ) -> tuple[list[Any], list[Any] | None]:
        """Plain jobs (data and maybe a key, no TTL) as one segment: O(1) index work per batch.

        Same outcome as pushing the items one by one: a key seen within the window, or
        earlier in this batch, answers the original id and adds nothing. Capacity is checked
        for the batch as a whole (PUSHB: all or nothing) or, with ``per_item``, item by item
        (coalesced single PUSHes: the ones past the capacity are refused).

        Returns, per item, its job id (a duplicate's is the original's; None when refused),
        and the plan (None: every item new; else per item None = new, a str = duplicate of an
        earlier job, an int = duplicate of that earlier item, ``_FULL`` = refused). A follower
        (``replies`` off) gets no ids.
        """
        check_transition(NEW, WAITING)  # once for the segment's jobs, before any change
        now, name = self.now_ms, q.name
        prefix = f"{self.partition}-"
        room = None
        if per_item:
            capacity = q.opts["capacity"]
            if capacity and q.preset["capacity"]:
                counts = q.counts
                room = capacity - (counts[WAITING] + counts[DELAYED] + counts[ACTIVE])
        plan: list[Any] | None = None
        fresh = datas
        first_sends = None
        if keys is not None and room is None and first_sends_only(keys):
            first_sends, keys = keys, None  # a forwarding node's first sends: recorded, never looked up
        if keys is not None or room is not None:
            plan = [None] * len(datas)
            hashed: list[Any] = [None] * len(datas)  # each client key's hash, taken once
            hash_seq = self._hash_seq
            first_in_batch: dict[str, int] = {}
            for i in range(len(datas)):
                key = keys[i] if keys is not None else None
                if key is not None:
                    if key.startswith(FORWARDED_FORMS):
                        earlier_id = self._forwarded_duplicate(key)  # type: ignore[attr-defined]
                        if earlier_id is not None:
                            plan[i] = earlier_id
                            continue
                        key = first_form(key)  # copies of one add in this batch find each other
                    else:
                        hashed[i] = hc = key_hash(name, key)
                        earlier_seq = hash_seq(*hc)
                        if earlier_seq is not None:
                            plan[i] = prefix + str(earlier_seq)
                            continue
                    earlier = first_in_batch.get(key)
                    if earlier is not None:
                        plan[i] = earlier
                        continue
                if room is not None:
                    if room <= 0:
                        plan[i] = _FULL
                        continue
                    room -= 1
                if key is not None:
                    first_in_batch[key] = i
            fresh = [d for d, step in zip(datas, plan) if step is None]
            if names is not None:
                names = [nm for nm, step in zip(names, plan) if step is None]
        n = len(fresh)
        if n and not per_item:
            self._check_push(q, {}, extra=n - 1)  # before any change: a refused batch leaves no trace
        first = self.seq + 1
        self.seq += n
        ids: list[Any] = []
        if first_sends is not None and n:
            self._note_forwarded(first, first_sends)  # type: ignore[attr-defined]  # ForwardedKeys
        if plan is not None:
            seq = first
            forwarded_seqs: list[int] = []
            forwarded_keys: list[str] = []
            hs: list[int] = []
            cs: list[int] = []
            key_seqs: list[int] = []
            for i, step in enumerate(plan):
                if step is None:
                    job_id = prefix + str(seq)
                    hc = hashed[i]
                    if hc is not None:
                        hs.append(hc[0])
                        cs.append(hc[1])
                        key_seqs.append(seq)
                    elif keys is not None and keys[i] is not None:  # a forwarding node's key
                        forwarded_seqs.append(seq)
                        forwarded_keys.append(first_form(keys[i]))
                    seq += 1
                    ids.append(job_id)
                elif step is _FULL:
                    ids.append(None)
                else:
                    ids.append(ids[step] if type(step) is int else self._wire_id_of(step))
            if hs:
                self._remember_hashes(hs, cs, key_seqs, now + IDEMPOTENCY_WINDOW_MS)
            if forwarded_keys:
                self._note_forwarded(forwarded_seqs, forwarded_keys)  # type: ignore[attr-defined]
        if n:
            opts = q.opts
            names = list(map(shared, names)) if names is not None and any(names) else None
            last = self.segments.last() if self.segments else None
            if last is not None and self._extends(last, q, first, n):
                self._extend_segment(q, last, fresh, now, names)
            else:
                self._hold_segment(q, Segment(first, fresh, name, now, opts["attempts"], opts["backoff"],
                                              opts["ttr"], names, space=self.segments.space))
            q.totals["enqueued"] += n
            if per_item:
                q.calls["PUSH"] = q.calls.get("PUSH", 0) + n  # as n accepted PUSH commands count
        if n and self._events is not None:
            self._events.extend([(name, seq, WAITING, None) for seq in range(first, first + n)])
        if not self._replies:
            return [], plan  # a follower's reply (and event feed) is never read
        if plan is not None:
            return ids, plan
        # The batch's ids made a thousand per C call and cut apart: a third of the per-id cost.
        return (joined_decimal_run(prefix, first, n).split("\n") if n else []), plan

    def _apply_push_run(self, run: PushRun) -> dict[str, Any]:
        """Consecutive plain PUSHes to one queue that the node put in one command.

        Each keeps its own outcome, exactly as if applied one by one: ``results`` holds per
        push the PUSH reply or the ``CommandError`` it would have raised.
        """
        q = self._queue(run.queue, create=True)
        datas, keys, names = run.datas, run.keys, run.names
        results: list[Any] = []
        if q.type == "log" or (q.preset["ttl"] and q.opts["ttl"]):
            for i, data in enumerate(datas):
                single = {"cmd": "PUSH", "queue": q.name, "data": data}
                if keys is not None and keys[i] is not None:
                    single["idempotencyKey"] = keys[i]
                if names is not None and names[i] is not None:
                    single["name"] = names[i]
                try:
                    results.append(self._op_PUSH(single))
                except CommandError as exc:
                    results.append(exc)
            return {"results": results}
        ids, plan = self._push_segment(q, datas, keys, per_item=True, names=names)
        if not self._replies:
            return {"results": results}
        for i, job_id in enumerate(ids):
            step = plan[i] if plan is not None else None
            if step is None:
                results.append({"id": job_id})
            elif step is _FULL:
                results.append(CommandError(ErrorCode.QUEUE_FULL, f"queue {q.name!r} is at its capacity of "
                                                                  f"{q.opts['capacity']}"))
            else:
                results.append({"id": job_id, "duplicate": True})
        return {"results": results}

    def _append_log(self, q: Queue, data: Any, tag: str | None) -> dict[str, Any]:
        lseq = q.log_next
        q.log_next += 1
        q.log[lseq] = (data.packed if type(data) is Raw else data, tag, self.now_ms)
        q.totals["enqueued"] += 1
        return {"id": f"{self.partition}-L{lseq}", "seq": lseq}

    def _op_PUSH(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"], create=True)
        if q.type == "log":
            self._check_log_capacity(q, 1)
            self._count(q, "PUSH")
            return self._append_log(q, cmd["data"], cmd.get("tag"))
        dup = self._duplicate(q, cmd)
        if dup is not None:
            return {"id": dup, "duplicate": True}
        if ("dedupe" in cmd or "debounce" in cmd) and (cmd.get("dedupe") is not None
                                                      or cmd.get("debounce") is not None):
            return self._push_deduped(q, cmd)  # type: ignore[attr-defined, no-any-return]  # DedupeOps
        self._check_push(q, cmd)
        self._count(q, "PUSH")
        if cmd.keys() <= SLOT_PUSH_FIELDS and not (q.preset["ttl"] and q.opts["ttl"]):
            return {"id": self._add_slot_like(q, cmd)}
        return {"id": self._wire_id(self._new_job(q, cmd["data"], cmd))}

    def _add_slot_like(self, q: Queue, cmd: dict[str, Any]) -> str:
        """Add ``cmd``'s job (checked, fields within :data:`SLOT_PUSH_FIELDS`, no TTL) as a slot
        (:meth:`_push_slot`), else as a job object the next such add may hold with it in a new
        segment; return its wire id."""
        if not self._push_slot(q, cmd):
            self._slot_hint = self._new_job(q, cmd["data"], cmd).seq
        custom = cmd.get("customId")
        return custom if custom is not None else f"{self.partition}-{self.seq}"

    def _push_slot(self, q: Queue, cmd: dict[str, Any]) -> bool:
        """Add ``cmd``'s job (checked, fields within :data:`SLOT_PUSH_FIELDS`) as the next slot of
        the partition's last segment when that segment ends just before it with jobs of ``q``
        pushed under the same defaults, or as the second slot of a new one when the job just
        before it is a job object such an add made (:meth:`_segment_of`). False when neither
        holds (the caller makes a job object). Same outcome as :meth:`_new_job`."""
        seq = self.seq + 1
        seg = self.segments.last() if self.segments else None
        if seg is None or not self._extends(seg, q, seq, 1):
            seg = self._segment_of(q, seq - 1)
            if seg is None:
                return False
        get = cmd.get
        preset = q.preset
        prio = (get("priority") or 0) if preset["priority"] else 0
        delay = (get("delay") or 0) if preset["delay"] else 0
        group = shared(get("group"))  # _check_push refused one where the queue's type has no groups
        custom, tag = get("customId"), shared(get("tag"))
        now = self.now_ms
        data = cmd["data"]
        self.seq = seq
        # A slot with a priority, a custom id or a tag waits under its segment's cursor of its
        # priority, a grouped one with an entry in its group's heap: none is leased as part of a run.
        own_entry = prio or group is not None or custom is not None or tag is not None
        self.segments.append(seg, data.packed if type(data) is Raw else data,
                             SLOT_DELAYED if delay else SLOT_READY if own_entry else SLOT_WAITING,
                             prio, now, now + delay, shared(get("name")), group, custom, tag)
        name = q.name
        if custom is not None:
            q.custom_ids[custom] = seq
        self._note_key(name, get("idempotencyKey"), seq, now)
        q.totals["enqueued"] += 1
        events = self._events
        if delay:
            if events is not None:
                events.append((name, seq, DELAYED, None))
            q.counts[DELAYED] += 1
            self.delayed.push(due_key(now + delay, seq))
            if group is not None:
                self._group_moved(q, group, NEW, DELAYED)  # type: ignore[attr-defined]  # ReadyIndex
            return True
        if events is not None:
            events.append((name, seq, WAITING, None))
        q.counts[WAITING] += 1
        q.prio_counts[prio] = q.prio_counts.get(prio, 0) + 1
        if group is not None:
            self._group_moved(q, group, NEW, WAITING)  # type: ignore[attr-defined]  # ReadyIndex
            self._enqueue_group(q, group, ready_key(prio, seq))  # type: ignore[attr-defined]  # ReadyIndex
        elif own_entry:
            self._ready_slot(q, seg, prio, seq)
        elif seg.low == seq:
            heapq.heappush(q.ready, seq)  # the segment's first waiting slot: its heap entry
        return True

    @staticmethod
    def _extends(seg: Segment, q: Queue, first: int, n: int) -> bool:
        """True when ``n`` jobs of ``q`` from seq ``first`` on may be added as more slots of
        ``seg``: it ends just before them, holds ``q``'s jobs pushed under ``q``'s present
        defaults, and stays within :data:`SEGMENT_SLOTS_MAX` slots."""
        opts = q.opts
        return (seg.end == first and seg.queue == q.name and len(seg.states) + n <= SEGMENT_SLOTS_MAX
                and seg.max_attempts == opts["attempts"] and seg.backoff_ms == opts["backoff"]
                and seg.ttr_ms == opts["ttr"])

    def _extend_segment(self, q: Queue, seg: Segment, datas: list[Any], now: int,
                        names: list[str | None] | None) -> None:
        """Plain waiting jobs ``seg.end ..`` as more slots of ``seg`` (what ``_hold_segment``
        does for a new segment of them)."""
        plain = seg.left
        self.segments.extend(seg, datas, now, names)
        if not plain:
            heapq.heappush(q.ready, seg.low)  # priority 0: the key is the seq
        n = len(datas)
        q.counts[WAITING] += n
        q.prio_counts[0] = q.prio_counts.get(0, 0) + n

    def _segment_of(self, q: Queue, seq: int) -> Segment | None:
        """A new segment holding job ``seq`` of ``q`` as its only slot, when ``seq`` is the job
        object the previous add made through ``_op_PUSH`` (:meth:`_push_slot` found no segment
        to extend) and nothing has changed it beyond what a slot records: still waiting or
        delayed, never attempted, under ``q``'s present defaults. Its heap entry (the ready
        heap's, its group's or the delayed heap's) stays and passes to the slot. None otherwise."""
        job = self.jobs.get(seq)
        opts = q.opts
        if (job is None or self._slot_hint != seq or job.queue != q.name or job.max_attempts != opts["attempts"]
                or job.backoff_ms != opts["backoff"] or job.ttr_ms != opts["ttr"]
                or seq in self.flow_parents or seq in self.flow_children or seq in self.flow_outbox
                or not slot_like(job.to_tuple(stored=True))):
            return None
        prio, group, custom, tag = job.priority, job.group, job.custom_id, job.tag
        code = (SLOT_DELAYED if job.state == DELAYED else SLOT_READY
                if prio or group is not None or custom is not None or tag is not None else SLOT_WAITING)
        seg = Segment(seq, [job.data], q.name, job.created_ms, job.max_attempts, job.backoff_ms, job.ttr_ms,
                      [job.name] if job.name is not None else None, states=bytearray([code]),
                      priorities=array("i", [prio]) if prio else None,
                      run_ats=array("q", [job.run_at_ms]) if job.run_at_ms != job.created_ms else None,
                      space=self.segments.space, groups=[group] if group is not None else None,
                      custom_ids=[custom] if custom is not None else None, tags=[tag] if tag is not None else None)
        del self.jobs[seq]
        self.segments.add(seg)
        if code == SLOT_READY and group is None:
            seg.cursors = {prio: seq}  # the job's ready-heap entry is the slot's cursor now
        return seg

    def _op_PUSHB(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"], create=True)
        reply = self._push_batch(q, None, None, cmd["jobs"])
        self._count(q, "PUSHB")  # after the checks: a refused batch leaves no trace
        return reply

    def _apply_push_batch(self, batch: PushBatch) -> dict[str, Any]:
        """A PUSHB in the node's replicated form for items with only data (and maybe a key)."""
        q = self._queue(batch.queue, create=True)
        reply = self._push_batch(q, batch.datas, batch.keys, None, batch.names)
        self._count(q, "PUSHB")
        return reply

    def _push_batch(self, q: Queue, datas: list[Any] | None, keys: list[str | None] | None,
                    jobs: list[dict[str, Any]] | None, names: list[str | None] | None = None) -> dict[str, Any]:
        """A PUSHB's items, as lists of ``datas``, ``keys`` and ``names`` when they carry nothing
        else (what bulk ingest sends: stored as one segment), else as the ``jobs`` dicts."""
        if datas is None:
            assert jobs is not None
            plain = split_plain(jobs)
            if plain is not None:
                datas, keys, names = plain
        if datas is not None:
            if q.type != "log" and not (q.preset["ttl"] and q.opts["ttl"]):
                return {"ids": self._push_segment(q, datas, keys, names=names)[0]}
            n = len(datas)
            items = []
            for d, k, nm in zip(datas, keys or [None] * n, names or [None] * n):
                item = {"data": d}
                if k is not None:
                    item["idempotencyKey"] = k
                if nm is not None:
                    item["name"] = nm
                items.append(item)
        else:
            assert jobs is not None
            items = jobs
        if q.type == "log":
            self._check_log_capacity(q, len(items))
            return {"ids": [self._append_log(q, item["data"], item.get("tag"))["id"] for item in items]}
        # Only items with a key or customId can be duplicates; only the first fresh item
        # needs the capacity check (state does not change while checking), later ones the
        # group check. Same outcome as checking every item, in a fraction of the calls.
        fresh = 0
        ahead: dict[str, int] = {}  # group -> its items before this one (groupMaxSize)
        for item in items:
            if ("idempotencyKey" in item or "customId" in item) and self._duplicate(q, item) is not None:
                continue
            if "dedupe" in item or "debounce" in item:
                self._check_dedupe(q, item)  # type: ignore[attr-defined]  # DedupeOps
            group = item.get("group")
            if group is not None:
                self._check_push(q, item, group_ahead=ahead.get(group, 0))
                ahead[group] = ahead.get(group, 0) + 1
            elif fresh == 0:
                self._check_push(q, item)
            fresh += 1  # a deduplicated item counts too: the capacity check errs on the safe side
        if fresh > 1:
            self._check_push(q, {}, extra=fresh - 1)
        ids = []
        deduped: list[int] = []  # indices of items a dedupe or debounce entry absorbed
        new_job = self._new_job
        prefix = f"{self.partition}-"
        slots = not (q.preset["ttl"] and q.opts["ttl"])  # else no slot: a job's TTL is its own
        for item in items:
            if "idempotencyKey" in item or "customId" in item:
                dup = self._duplicate(q, item)
                if dup is not None:
                    ids.append(dup)
                    continue
            if item.get("dedupe") is not None or item.get("debounce") is not None:
                existing = self._deduped(q, item)  # type: ignore[attr-defined]  # DedupeOps
                if existing is not None:
                    deduped.append(len(ids))
                    ids.append(existing)
                    continue
                if item.get("debounce") is not None:
                    item = self._debounce_delay(item)  # type: ignore[attr-defined]  # DedupeOps
                ids.append(self._add_deduped(q, item))  # type: ignore[attr-defined]  # DedupeOps
                continue
            if slots and item.keys() <= SLOT_PUSH_FIELDS:
                ids.append(self._add_slot_like(q, item))  # held as a single add with the same fields
                continue
            job = new_job(q, item["data"], item)
            custom = job.custom_id
            ids.append(prefix + str(job.seq) if custom is None else custom)
        return {"ids": ids, "deduped": deduped} if deduped else {"ids": ids}


def shared(text: Any) -> Any:
    """One object for equal strings that many jobs hold (names, groups): each add's frame
    decodes its own copy, which a waiting job would otherwise keep (about 60 bytes a job)."""
    return sys.intern(text) if type(text) is str else text


#: The fields of a PUSH whose job can be held as a segment's slot (``_push_slot``): what
#: ``queue.add()`` sends with a priority, a delay, a name, a group, a custom id or a tag (``waitMs``
#: is the dispatcher's).
SLOT_PUSH_FIELDS = frozenset({"cmd", "reqId", "queue", "data", "idempotencyKey", "name", "priority", "delay",
                              "group", "customId", "tag", "waitMs"})
#: ``_push_segment``'s plan mark for an item refused for capacity.
_FULL = object()
#: Job options kept in ``Job.meta`` (rare: no slot of their own).
META_OPTIONS = ("removeOnComplete", "removeOnFail", "backoffType", "stackTraceLimit", "keepLogs", "traceContext")
