"""Runs of consecutive decimal strings (job ids, lease tokens) without an ``int -> str`` per item.

A batch pull names up to thousands of consecutive jobs (``"3-1200"``, ``"3-1201"``, ...) and
as many lease tokens, and a batch ack is checked against the same runs. ``str(int)`` costs a
few hundred nanoseconds a call, the largest part of building or checking such a run. Numbers
that share all but their last three digits share one stem, so a run is the stem joined with
pre-built three-digit suffixes: one concatenation per item, or one ``join`` in C per thousand.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["decimal_pieces", "decimal_run", "joined_decimal_run", "decimals_after", "consecutive_decimals"]

_SUFFIXES = tuple(f"{i:03d}" for i in range(1000))


def decimal_pieces(first: int, count: int) -> Iterator[tuple[int, int, int]]:
    """``(high, low, take)`` pieces of ``first .. first+count-1``: ``take`` numbers from
    ``high * 1000 + low`` sharing the stem ``high``; high -1 for numbers under 1000 (no stem)."""
    n, left = first, count
    while left > 0:
        high, low = divmod(n, 1000) if n >= 1000 else (-1, n)
        take = min(left, 1000 - low)
        yield high, low, take
        n += take
        left -= take


def decimal_run(prefix: str, first: int, count: int) -> list[str]:
    """``[prefix + str(first), prefix + str(first + 1), ...]``, ``count`` items (``first`` ≥ 0)."""
    out: list[str] = []
    for high, low, take in decimal_pieces(first, count):
        if high < 0:
            out += [prefix + str(i) for i in range(low, low + take)]
        else:
            stem = prefix + str(high)
            out += [stem + s for s in _SUFFIXES[low:low + take]]
    return out


def joined_decimal_run(prefix: str, first: int, count: int, sep: str = "\n") -> str:
    """``sep.join(decimal_run(prefix, first, count))``, built a thousand items per C call."""
    parts: list[str] = []
    for high, low, take in decimal_pieces(first, count):
        if high < 0:
            parts.append(sep.join([prefix + str(i) for i in range(low, low + take)]))
        else:
            stem = prefix + str(high)
            parts.append(stem + (sep + stem).join(_SUFFIXES[low:low + take]))
    return sep.join(parts)


def decimals_after(prefix: str, texts: list[object]) -> list[int] | None:
    """The numbers when every text is ``prefix`` and then 1 to 19 ASCII digits (what ``int``
    reads from them); None for anything else. Checked on the joined texts, so the work per
    item runs in C."""
    if not texts:
        return None
    try:
        joined = "\n" + "\n".join(texts)  # type: ignore[arg-type]
    except TypeError:
        return None
    marked = "\n" + prefix
    if joined.count("\n") != len(texts) or joined.count(marked) != len(texts):
        return None
    digits = joined.replace(marked, "\n")[1:]
    if not digits.replace("\n", "").isdigit() or not digits.isascii():
        return None
    parts = digits.split("\n")
    if not 0 < min(map(len, parts)) <= max(map(len, parts)) <= 19:
        return None
    return list(map(int, parts))


def consecutive_decimals(prefix: str, texts: list[object]) -> range | None:
    """``range(first, first + len(texts))`` when ``texts`` are :func:`decimal_run`'s (``prefix``,
    then consecutive numbers); None for anything else (:func:`decimals_after` reads the rest).
    One number parsed and one comparison in C, however many texts."""
    if not texts:
        return None
    head = texts[0]
    if type(head) is not str or not head.startswith(prefix):
        return None
    digits = head[len(prefix):]
    if not 0 < len(digits) <= 19 or not digits.isascii() or not digits.isdigit():
        return None
    first = int(digits)
    if first + len(texts) > 10**19:  # its last number would have 20 digits
        return None
    try:
        joined = "\n".join(texts)  # type: ignore[arg-type]
    except TypeError:
        return None
    if joined != joined_decimal_run(prefix, first, len(texts)):
        return None
    return range(first, first + len(texts))
