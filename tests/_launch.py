"""Subprocess helpers for the integration tests: free ports, a clean environment, and runs
that fail with the tail of their output."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict:
    """The parent's environment without ATAC_*/PARALLELISM_*/ACCELERATE_*/torchrun variables, 1 thread."""
    drop = ("ATAC_", "PARALLELISM_CONFIG_", "ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **extra)
    return env


def run(cmd: list, *, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env or clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr)[-6000:]
        raise AssertionError(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{out}")
    return proc


def torchrun(nproc: int, script, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    # --standalone: torchrun binds a free port itself (no race between picking a port and binding it)
    return run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", nproc,
                script, *args], timeout=timeout)


def torchrun_json(nproc: int, worker: str, out_dir, timeout: float = 600) -> dict:
    """Run ``tests/<worker>`` under torchrun with an output path and read back the JSON its rank 0 wrote."""
    import json

    out = Path(out_dir) / "out.json"
    torchrun(nproc, ROOT / "tests" / worker, out, timeout=timeout)
    return json.loads(out.read_text())


def torchrun_modes(tmp_path_factory, worker: str, modes=("accelerate", "trainer"), timeout: float = 600) -> dict:
    """``{mode: JSON}``: ``tests/<worker> OUT MODE`` under torchrun (2 processes) once per mode."""
    import json

    out = {}
    for mode in modes:
        path = tmp_path_factory.mktemp(f"{Path(worker).stem}_{mode}") / "out.json"
        torchrun(2, f"tests/{worker}", path, mode, timeout=timeout)
        out[mode] = json.loads(path.read_text())
    return out


def accelerate_launch(config: str, script, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", ROOT / config, "--main_process_port", free_port(),
                script, *args], timeout=timeout)
