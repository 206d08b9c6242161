"""Hypothesis profiles for the whole suite (docs/TESTING.md, "Property tests").

* ``atac`` (default): every run draws new examples (no ``derandomize``), so CI explores more
  of the input space over time. A failure stays reproducible: Hypothesis prints the shrunk
  falsifying example and, with ``print_blob``, a ``@reproduce_failure(...)`` line that
  replays it exactly; the local example database (``.hypothesis/``) replays it first on the
  next run.
* ``fixed``: the same examples on every run (``derandomize=True``), for bisecting a
  failure: ``pytest --hypothesis-profile=fixed`` (or pin one run with ``--hypothesis-seed=N``).

Settings given in a test's ``@settings(...)`` (example counts, deadlines) override these.
"""

from hypothesis import settings

settings.register_profile("atac", print_blob=True)
settings.register_profile("fixed", print_blob=True, derandomize=True)
settings.load_profile("atac")


import os  # noqa: E402

import pytest  # noqa: E402

if os.environ.get("MUTANT_UNDER_TEST"):
    # mutmut forks one child per mutant from a process that has run torch: a child inheriting the
    # parent's OpenMP thread pool can deadlock at its first parallel op (CPU idle until mutmut's
    # timeout), and a mutant that survives up to a torch test was reported "timeout", i.e. killed.
    # One thread from the start creates no pool (docs/TESTING.md, "Twenty-second pass").
    import threading

    import torch
    from tqdm import tqdm

    torch.set_num_threads(1)
    # tqdm's default write lock includes a multiprocessing semaphore, shared by every forked child: a
    # child killed by mutmut's timeout while it holds the lock (inside a progress bar) leaves it taken,
    # and every later child hangs at its first bar, so each later mutant there is reported "timeout"
    # (docs/TESTING.md, "Twenty-fourth pass"). A per-process thread lock cannot outlive its child, and
    # without tqdm's monitor thread no thread of the parent holds it at a fork.
    tqdm.set_lock(threading.RLock())
    tqdm.monitor_interval = 0


@pytest.fixture
def one_thread():
    """One torch thread for the test (tiny kernels: intra-op threads only add overhead, and two threads
    contending on the shared 2-core CI machine made such tests up to 15x slower)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def no_contiguous_candidate(monkeypatch):
    """ATP without its contiguous candidate (``atac_hf.sharding.atp.CONTIGUOUS_CANDIDATE``), for
    tests that pin the other candidates' choices on packs of a few tokens, where one contiguous run
    per rank (the fewest kernel calls) would now win (tests/test_atp_contiguous.py covers it)."""
    monkeypatch.setattr("atac_hf.sharding.atp.CONTIGUOUS_CANDIDATE", False)
