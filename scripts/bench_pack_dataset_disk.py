#!/usr/bin/env python
"""pack_dataset on an on-disk source: memory and time with the rows written to a cache file
(the default for a source backed by cache files) against building them in memory, and TRL's
``pack_dataset`` (``Dataset.map``, which writes cache files too), side by side in one run.

The source: the shipped ``wlbllm`` lengths resampled to each size (seed 0), int32 token ids,
``save_to_disk`` then ``load_from_disk`` (memory-mapped). Each run is a fresh subprocess with
one Arrow thread. *Peak anonymous memory*: the largest ``RssAnon`` over the run, sampled every
5 ms, less the value before it (file-backed pages of the memory-mapped source and output are
left out: the kernel reclaims those; anonymous memory is what runs a machine out of memory).

    python scripts/bench_pack_dataset_disk.py --sizes 100000,250000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_packing import _proc_kb, token_dataset  # this script's folder is on sys.path

RUNS = [  # (label, kind, options)
    ("atac pack_dataset, defaults (rows to a cache file)", "ours", {}),
    ("atac pack_dataset, same call again (loads the cache file)", "again", {}),
    ("atac pack_dataset, keep_in_memory=True", "ours", {"keep_in_memory": True}),
    ("TRL pack_dataset, strategy=bfd (Dataset.map, cache files)", "trl", {}),
]


def make_source(n: int, path: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    token_dataset(n).save_to_disk(str(path))


def worker(spec: dict) -> dict:
    import datasets
    import pyarrow as pa

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    datasets.disable_progress_bars()
    from atac_hf import pack_dataset

    if spec["kind"] == "trl":  # imported before the clock starts (TRL's import alone takes seconds)
        from trl.data_utils import pack_dataset as trl_pack_dataset

    src = datasets.load_from_disk(spec["source"])
    if spec["kind"] == "again":  # the first call, untimed, writes the cache file the timed one loads
        pack_dataset(src, max_tokens=spec["max_tokens"], progress=False)
    base, peak, stop = _proc_kb("RssAnon"), [0], threading.Event()

    def poll():
        while not stop.is_set():
            peak[0] = max(peak[0], _proc_kb("RssAnon"))
            time.sleep(0.005)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    t0, w0 = time.process_time(), time.perf_counter()
    if spec["kind"] == "trl":
        out = trl_pack_dataset(src, spec["max_tokens"], strategy="bfd")
    else:
        out = pack_dataset(src, max_tokens=spec["max_tokens"], progress=False, **spec["options"])
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    stop.set()
    t.join()
    peak[0] = max(peak[0], _proc_kb("RssAnon"))
    return {"cpu_s": cpu, "wall_s": wall, "peak_anon_mb": (peak[0] - base) / 1024, "rows": len(out),
            "on_disk": bool(out.cache_files), "source_mb": sum(os.path.getsize(f["filename"]) for f in src.cache_files)
            / 2**20}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        print(json.dumps(worker(json.loads(argv[1]))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100000,250000", help="samples per source (comma-separated)")
    p.add_argument("--max-tokens", type=int, default=131072)
    p.add_argument("--no-trl", action="store_true")
    args = p.parse_args(argv)
    print("| samples | source on disk | run | CPU time | wall time | peak anonymous memory | rows | rows on disk |")
    print("|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in args.sizes.split(",") if x.strip()]:
        tmp = Path(tempfile.mkdtemp(prefix="atac-bench-disk-"))
        try:
            make_source(n, tmp / "src")
            for label, kind, options in RUNS:
                if kind == "trl" and args.no_trl:
                    continue
                # every run from a fresh copy: no cache file of an earlier run is found
                run_src = tmp / f"src-{kind}-{len(options)}"
                shutil.copytree(tmp / "src", run_src)
                spec = dict(source=str(run_src), kind=kind, options=options, max_tokens=args.max_tokens)
                res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                                     capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
                shutil.rmtree(run_src, ignore_errors=True)
                if res.returncode != 0:
                    print(f"note: {label} at {n} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
                    continue
                r = json.loads(res.stdout.strip().splitlines()[-1])
                print(f"| {n:,} | {r['source_mb']:,.0f} MiB | {label} | {r['cpu_s']:.2f} s | {r['wall_s']:.2f} s "
                      f"| {r['peak_anon_mb']:,.0f} MiB | {r['rows']:,} | {'yes' if r['on_disk'] else 'no'} |",
                      flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
