"""A node raises its soft limit of open files at start (payload files hold a descriptor each)."""

from __future__ import annotations

import resource
import subprocess
import sys

from shoal.node.server import OPEN_FILES_WANTED

SCRIPT = """
import resource
from shoal.node.server import raise_open_files_limit
print(raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def _low_soft_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def test_the_soft_limit_is_raised_towards_the_hard_one() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                         preexec_fn=_low_soft_limit, check=True).stdout.split()
    want = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(OPEN_FILES_WANTED, hard)
    assert [int(x) for x in out] == [want, want]


def test_a_higher_soft_limit_is_kept() -> None:
    from shoal.node.server import raise_open_files_limit
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert raise_open_files_limit(wanted=16) == soft
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft
