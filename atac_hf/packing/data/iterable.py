"""Streaming WFAP: pack an iterable of samples window by window, resumably.

:class:`PackedIterableDataset` buffers a window of samples, packs it with a
:class:`~atac_hf.packing.stream.StreamPacker` (window sizing and DP ordering as in
:mod:`.feeding`), and yields packed rows; the end of the stream flushes everything.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import torch
from torch.utils.data import IterableDataset

from ...cost import CostModel
from ..config import PackingConfig
from .window_planner import WindowPlanner, _check_common, _config_parts, _fingerprint

__all__ = ["PackedIterableDataset"]

_STREAM_FORMAT = "atac-hf/packed-iterable/v1"


class PackedIterableDataset(IterableDataset):
    """Pack an iterable of samples into rows, window by window (streaming WFAP).

    Yields ``{"input_ids": flat, "seq_lengths": [...], "labels": flat?, "spans": [[id, start, end], ...]}``
    where ``id`` is the sample's position in the source stream; ``labels`` appears when a
    sample of the row has labels (others contribute their ``input_ids``). Rows feed
    :class:`~atac_hf.packing.data.collator.PackedDataCollator` (use ``batch_size=1``).

    Args:
        source: a re-iterable of mappings with ``input_ids`` (``datasets.IterableDataset``,
            a list, a generator factory's output...); it must replay the same order on each
            ``iter()`` for resume to be exact. Empty samples are skipped and counted.
        config, cost_model, window_size, num_replicas, even_batches: as in :class:`WFAPBatchSampler`.

    Windows are sized by the packer (:meth:`WindowPlanner.window_count`): samples read
    ahead of the current window wait in a look-ahead buffer, which is part of the state.

    Resume: ``state_dict()`` records ``consumed`` (source samples read), the packer state,
    the packs of the current window not yet yielded, and the tokens (and labels) of every
    sample not yet fully yielded. ``load_state_dict`` restores them; the next ``iter()``
    re-positions the source by skipping ``consumed`` samples (``datasets.IterableDataset.skip``,
    else reading and discarding them), so no sample is lost or repeated. Iterate it in the
    process that saves the state (``num_workers=0``; with one worker the state lives in the
    worker; more workers are refused). With Accelerate, ``dispatch_batches=False`` (rows differ in length,
    so the dispatcher cannot concatenate them) - each process then packs the stream and
    ``IterableDatasetShard`` deals rows round-robin, as :func:`replica_order` assumes.
    """

    _KEEP_WINDOWS = 2  # window-boundary snapshots kept, to rewind past a prefetching loader

    def __init__(self, source: Iterable[Mapping[str, Any]], config: PackingConfig, *,
                 window_size: int | None = None, num_replicas: int = 1, cost_model: CostModel | None = None,
                 even_batches: bool = True) -> None:
        _check_common(config, window_size, num_replicas)
        self.source = source
        self.config = config
        self.cost_model = cost_model
        self.window_size = window_size
        self.num_replicas = int(num_replicas)
        self.even_batches = bool(even_batches)
        self.fingerprint = _fingerprint(**_config_parts(config, cost_model, window_size=window_size,
                                                        num_replicas=self.num_replicas,
                                                        even_batches=self.even_batches))
        self._reset()

    def _reset(self) -> None:
        self._planner = WindowPlanner(self.config, self.cost_model, window_size=self.window_size,
                                       num_replicas=self.num_replicas, even_batches=self.even_batches)
        self._st: dict[str, Any] = {"consumed": 0, "exhausted": False, "num_rows": 0, "num_empty_skipped": 0,
                                    "pending": [], "data": {}, "remaining": {}, "lookahead": []}
        self._snapshots = [self._snapshot()]
        self._resumed = False

    @property
    def num_empty_skipped(self) -> int:
        return int(self._st["num_empty_skipped"])

    def _snapshot(self) -> dict[str, Any]:
        st = self._st
        return {**st, "pending": list(st["pending"]), "data": dict(st["data"]),
                "remaining": dict(st["remaining"]), "lookahead": list(st["lookahead"]),
                "planner": self._planner.state_dict()}

    def _open_source(self) -> Iterator[Mapping[str, Any]]:
        n = self._st["consumed"]
        if n and _is_hf_iterable(self.source):
            return iter(self.source.skip(n))
        return itertools.islice(iter(self.source), n, None)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ValueError(
                f"PackedIterableDataset is a sequential, stateful packer; it cannot run in {info.num_workers} "
                "DataLoader workers (set num_workers to 0 or 1)"
            )
        st = self._st
        resumed, self._resumed = self._resumed, False
        if st["exhausted"] and not st["pending"] and not st["lookahead"]:  # a finished pass: start over
            if resumed:  # ... unless a state saved at the end of the pass was just loaded: nothing is left
                return
            self._reset()
            st = self._st
        source = None if st["exhausted"] else self._open_source()
        while True:
            while st["pending"]:
                row = _take_row(st)
                yield row
            if st["exhausted"] and not st["lookahead"]:
                return
            # read ahead until the packer's window is full (or the source ends)
            while True:
                buf = np.array([len(st["data"][sid]["input_ids"]) for sid in st["lookahead"]], dtype=np.int64)
                k = self._planner.window_count(buf, 0, more_coming=not st["exhausted"])
                if k < len(buf) or st["exhausted"]:
                    break
                for _ in range(max(64, len(buf))):
                    try:
                        sample = next(source)
                    except StopIteration:
                        st["exhausted"] = True
                        break
                    sid = st["consumed"]
                    st["consumed"] += 1
                    ids_, labels = _sample_tokens(sample, sid)
                    if not ids_:
                        st["num_empty_skipped"] += 1
                        continue
                    st["data"][sid] = {"input_ids": ids_, "labels": labels}
                    st["remaining"][sid] = int(self._planner.effective_lengths(np.int64(len(ids_))))
                    st["lookahead"].append(sid)
            ids, st["lookahead"] = st["lookahead"][:k], st["lookahead"][k:]
            lengths = [len(st["data"][sid]["input_ids"]) for sid in ids]
            packs = self._planner.add(ids, lengths, last=st["exhausted"] and not st["lookahead"])
            st["pending"] = [[list(s) for s in p] for p in packs]
            self._snapshots = (self._snapshots + [self._snapshot()])[-self._KEEP_WINDOWS:]

    def state_dict(self, num_rows: int | None = None) -> dict[str, Any]:
        """JSON-serialisable state after ``num_rows`` rows (default: rows yielded so far).

        Pass ``num_rows`` (rows the training loop consumed) when a prefetching loader has
        drawn rows the loop has not used; it may lie up to one window back.

        Raises:
            ValueError: ``num_rows`` outside the rows this object can rewind to.
        """
        k = self._st["num_rows"] if num_rows is None else int(num_rows)
        base = next((s for s in reversed(self._snapshots) if s["num_rows"] <= k), None)
        if base is None or k > base["num_rows"] + len(base["pending"]):
            lo = self._snapshots[0]["num_rows"]
            raise ValueError(f"num_rows={k}: can only take the state at rows {lo}..{self._st['num_rows']}")
        st = {**base, "pending": list(base["pending"]), "data": dict(base["data"]),
              "remaining": dict(base["remaining"]), "lookahead": list(base["lookahead"])}
        for _ in range(k - base["num_rows"]):
            _take_row(st)
        st["data"] = [[sid, d["input_ids"], d["labels"]] for sid, d in st["data"].items()]
        st["remaining"] = [[sid, n] for sid, n in st["remaining"].items()]
        return {"format": _STREAM_FORMAT, "fingerprint": self.fingerprint, **st}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`; the next ``iter()`` continues from it (and
        yields nothing when the state was taken at the end of the pass).

        Raises:
            ValueError: a state of another format or packing configuration, or with missing fields.
        """
        if not isinstance(state, Mapping) or state.get("format") != _STREAM_FORMAT:
            raise ValueError(f"not a PackedIterableDataset state (expected format {_STREAM_FORMAT!r})")
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"stream state fingerprint {state.get('fingerprint')!r} != {self.fingerprint!r}: it was saved with "
                "different settings (config, cost_model, window_size, num_replicas, even_batches)"
            )
        missing = sorted({"planner", "consumed", "exhausted", "num_rows", "num_empty_skipped", "pending", "data",
                          "remaining"} - set(state))
        if missing:
            raise ValueError(f"malformed PackedIterableDataset state (missing {missing}): a truncated or edited "
                             "checkpoint?")
        try:  # parse everything before changing anything
            st = {
                "consumed": int(state["consumed"]), "exhausted": bool(state["exhausted"]),
                "num_rows": int(state["num_rows"]), "num_empty_skipped": int(state["num_empty_skipped"]),
                "pending": [[[int(x) for x in s] for s in p] for p in state["pending"]],
                "data": {int(sid): {"input_ids": [int(t) for t in ids],
                                    "labels": None if lab is None else [int(t) for t in lab]}
                         for sid, ids, lab in state["data"]},
                "remaining": {int(sid): int(n) for sid, n in state["remaining"]},
                "lookahead": [int(sid) for sid in state.get("lookahead", [])],
            }
            if not isinstance(state["exhausted"], bool):
                raise ValueError(f"'exhausted' must be true or false, got {state['exhausted']!r}")
            if not isinstance(state["planner"], Mapping) or not isinstance(state["planner"].get("packer"), Mapping):
                raise ValueError("'planner' must hold the packer state")
        except (TypeError, ValueError) as e:
            raise ValueError(f"malformed PackedIterableDataset state ({e}): a truncated or edited checkpoint?") from None
        self._planner.load_state_dict(state["planner"])
        self._st = st
        self._resumed = True
        self._snapshots = [self._snapshot()]


def _is_hf_iterable(source: Any) -> bool:
    try:
        from datasets import IterableDataset as HFIterableDataset
    except ImportError:  # pragma: no cover - datasets is a dependency
        return False
    return isinstance(source, HFIterableDataset)


def _sample_tokens(sample: Any, sid: int) -> tuple[list[int], list[int] | None]:
    if not isinstance(sample, Mapping) or "input_ids" not in sample:
        found = sorted(sample) if isinstance(sample, Mapping) else type(sample).__name__
        raise ValueError(
            f"source sample {sid} has no 'input_ids'; found: {found} "
            "(tokenize the text, or rename the token column to 'input_ids')"
        )
    ids = _to_list(sample["input_ids"])
    labels = sample.get("labels")
    labels = None if labels is None else _to_list(labels)
    if labels is not None and len(labels) != len(ids):
        raise ValueError(f"source sample {sid}: labels has {len(labels)} entries but input_ids has {len(ids)}")
    return ids, labels


def _to_list(x: Any) -> list[int]:
    if hasattr(x, "tolist"):
        x = x.tolist()
    return [int(v) for v in x]


def _take_row(st: dict[str, Any]) -> dict[str, Any]:
    """Pop the next pending pack of ``st`` and build its row; free samples fully yielded."""
    pack = st["pending"].pop(0)
    ids: list[int] = []
    labels: list[int] = []
    has_labels = False
    for sid, s, e in pack:
        d = st["data"][sid]
        ids += d["input_ids"][s:e]
        if d["labels"] is not None:
            has_labels = True
            labels += d["labels"][s:e]
        else:
            labels += d["input_ids"][s:e]
    row = {"input_ids": ids, "seq_lengths": [e - s for _, s, e in pack]}
    if has_labels:
        row["labels"] = labels
    row["spans"] = [list(span) for span in pack]
    for sid, s, e in pack:
        st["remaining"][sid] -= e - s
        if st["remaining"][sid] <= 0:
            del st["remaining"][sid]
            del st["data"][sid]
    st["num_rows"] += 1
    return row
