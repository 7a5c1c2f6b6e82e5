"""A Shoal node that counts the calls of Shoal's own functions by file (``bench/push_path.py``).

Run as a node command: ``python bench/_traced_node.py --config ... --id ...``. Every
:data:`SNAPSHOT_S` it appends ``[time, {file: calls}]`` to ``$SHOAL_TRACE_DIR/<pid>.jsonl``;
files are relative to ``$SHOAL_TRACE_ROOT`` (the repository), and only files under it count.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from collections import Counter
from types import FrameType
from typing import Any

SNAPSHOT_S = 0.25


def main() -> None:
    root = os.environ["SHOAL_TRACE_ROOT"].rstrip("/") + "/"
    out = os.path.join(os.environ["SHOAL_TRACE_DIR"], f"{os.getpid()}.jsonl")
    counts: Counter[str] = Counter()
    cut = len(root)

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(root):
                counts[path[cut:]] += 1

    def snapshots() -> None:
        while True:
            time.sleep(SNAPSHOT_S)
            line = json.dumps([time.time(), dict(counts)])
            with open(out, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")

    sys.setprofile(profile)
    threading.setprofile(profile)
    threading.Thread(target=snapshots, name="call-counts", daemon=True).start()
    sys.argv = ["shoal.node", *sys.argv[1:]]
    runpy.run_module("shoal.node", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
