"""What ``accelerate launch`` started, against what it was asked for.

Without CUDA, ``accelerate launch --num_processes 2 train.py`` (no ``--multi_gpu``) and a launch
config with ``distributed_type: MULTI_CPU`` go through Accelerate's simple launcher, which runs
several processes only under mpirun: otherwise it starts the script once, as a single process,
and exports no ``parallelism_config`` (no ``PARALLELISM_CONFIG_*``), with no word about it. A
run then trains on one process, without CP, or fails with ``cp_size=2 does not divide the world
size 1`` although ``--num_processes 2`` was given. That launcher sets ``MASTER_ADDR`` only when
asked for several processes (or machines), and a process that torchrun or mpirun started has its
world size in the environment, so the case can be told from the environment alone.
"""

from __future__ import annotations

import warnings
from typing import Mapping

# world-size variables of the launchers that do start several processes (torchrun, Open MPI, MPICH / Intel MPI,
# MVAPICH, PMIx)
_STARTED_SEVERAL = ("WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE",
                    "PMIX_SIZE")

ONE_PROCESS_HINT = (
    "accelerate launch was asked for several processes but started this one alone (its simple launcher: "
    "`--num_processes N` without `--multi_gpu` on a machine without CUDA, or `distributed_type: MULTI_CPU`, runs "
    "several processes only under mpirun, and exports no parallelism_config). On one CPU machine launch with "
    "`accelerate launch --multi_gpu --num_processes N train.py` (torchrun; the add-on selects gloo on CPU) or a "
    "launch config with `distributed_type: MULTI_GPU` and `use_cpu: true`, as configs/cpu_cp2.yaml"
)


def one_process_launch(environ: Mapping[str, str], world_size: int) -> str:
    """:data:`ONE_PROCESS_HINT` where ``accelerate launch`` started this process alone although it
    was asked for several (see the module doc), else ``""``."""
    if world_size != 1 or "ACCELERATE_DYNAMO_BACKEND" not in environ or not environ.get("MASTER_ADDR"):
        return ""
    return "" if any(environ.get(k) for k in _STARTED_SEVERAL) else ONE_PROCESS_HINT


def warn_one_process_launch(hint: str) -> None:
    """Warn with ``hint``, what :func:`one_process_launch` returned, where it found the case (not empty): the run
    goes on as one process."""
    if hint:
        warnings.warn(f"{hint}. This run goes on as a single process (no data or context parallelism).",
                      UserWarning, stacklevel=3)
