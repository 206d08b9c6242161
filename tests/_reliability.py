"""Case counters for the reliability tests (docs/RELIABILITY.md reports them).

Every reliability test adds what it ran with :func:`count`; at the end of each test module
the counts are printed (``pytest -s`` or ``-rA`` shows them) and, when the environment
variable ``RELIABILITY_COUNTS`` names a file, merged into that JSON file.
"""

from __future__ import annotations

import json
import os
from collections import Counter

from hypothesis import HealthCheck

from atac_hf.cost import CostModel

# hypothesis settings and a small exact-ish cost model shared by the reliability tests. Not
# derandomized: each run draws new examples, reproducible from the printed blob (tests/conftest.py)
FAST = dict(deadline=None, print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COST = CostModel(linear_s_per_token=1.0, attn_s_per_pair=0.05, tile=4, segment_overhead_s=0.5)

COUNTS: Counter = Counter()


def count(name: str, n: int = 1) -> None:
    COUNTS[name] += int(n)


def flush(module: str) -> None:
    if not COUNTS:
        return
    print(f"\n[reliability] {module}: " + json.dumps(dict(sorted(COUNTS.items()))))
    path = os.environ.get("RELIABILITY_COUNTS")
    if path:
        data = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        for k, v in COUNTS.items():
            data[k] = data.get(k, 0) + v
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dict(sorted(data.items())), f, indent=1)
    COUNTS.clear()
