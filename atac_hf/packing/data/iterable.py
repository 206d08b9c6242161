"""Streaming WFAP: pack an iterable of samples window by window, resumably.

:class:`PackedIterableDataset` buffers a window of samples, packs it with a
:class:`~atac_hf.packing.stream.StreamPacker` (window sizing and DP ordering as in
:mod:`.window_planner`), and yields packed rows; the end of the stream flushes everything.
"""

from __future__ import annotations

import itertools
import json
import warnings
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import torch
from torch.utils.data import IterableDataset

from ...cost import CostModel
from ..config import MAX_LENGTH, PackingConfig
from ..validate import (InputTypeError, _is_int, _short, check_token_ids, state_bool, state_int, state_list,
                        state_spans, state_value_int)
from .ranks import first_rank_warnings, is_first_rank
from .window_planner import WindowPlanner, _check_common, _config_parts, _fingerprint

__all__ = ["PackedIterableDataset", "check_reiterable"]

_STREAM_FORMAT = "atac-hf/packed-iterable/v3"  # v3: the pass (epoch) and the settings, by name
_STREAM_FORMAT_V2 = "atac-hf/packed-iterable/v2"  # v2: the planner's reserve; read as pass 0 (v1 cannot be resumed)


def check_reiterable(source: Any, what: str = "source") -> None:
    """Refuse a one-shot iterator (a generator object, ``iter(list)``, a file): its second
    ``iter()`` is empty, so the second pass would train on nothing and a resume, which
    re-iterates the pass and skips what was consumed, would silently lose those samples.

    Raises:
        TypeError: ``source`` is an iterator (it has ``__next__``).
    """
    if isinstance(source, Iterator):
        raise TypeError(
            f"{what} is a one-shot iterator ({type(source).__name__}): a second pass or a resume would re-read it "
            "empty and lose its samples without an error. Pass something that replays the stream on each iter(): "
            "a list, a datasets.IterableDataset (datasets.IterableDataset.from_generator(gen)), a torch "
            "IterableDataset, or an object whose __iter__ calls your generator function")


class PackedIterableDataset(IterableDataset):
    """Pack an iterable of samples into rows, window by window (streaming WFAP).

    Yields ``{"input_ids": flat, "seq_lengths": [...], "labels": flat?, "spans": [[id, start, end], ...]}``
    where ``id`` is the sample's position in the source stream; ``labels`` appears when a
    sample of the row has labels (others contribute their ``input_ids``). Rows feed
    :class:`~atac_hf.packing.data.collator.PackedDataCollator` (use ``batch_size=1``).

    Args:
        source: a re-iterable of mappings with ``input_ids`` (``datasets.IterableDataset``,
            a list, a generator factory's output...); it must replay the same order on each
            ``iter()`` of the same pass for resume to be exact: a source with ``set_epoch``
            (``datasets.IterableDataset``, reshuffled per epoch) gets ``set_epoch(pass)``
            before each pass. Empty samples are skipped and counted.
        config, cost_model, window_size, num_replicas, even_batches: as in :class:`WFAPBatchSampler`.

    Windows are sized by the packer (:meth:`WindowPlanner.window_count`): samples read
    ahead of the current window wait in a look-ahead buffer, which is part of the state.

    Passes: each ``iter()`` after a finished pass starts the next one; :attr:`epoch` counts
    them (0 first) and is part of the state.

    Resume: ``state_dict()`` records the pass (``epoch``), ``consumed`` (source samples read
    in it), the packer state, the packs of the current window not yet yielded, and the tokens
    (and labels) of every sample not yet fully yielded. ``load_state_dict`` restores them; the
    next ``iter()`` re-positions the source: ``set_epoch(epoch)`` where it has one, then
    ``consumed`` samples skipped (``datasets.IterableDataset.skip`` in pass 0; in a later pass
    read and discarded: ``skip`` drops that epoch's shuffle order), so no
    sample is lost or repeated, in any pass. Iterate it in the
    process that saves the state (``num_workers=0``; with one worker the state lives in the
    worker, and ``state_dict()`` here warns that it is stale; more workers are refused). With
    Accelerate, ``dispatch_batches=False`` (rows differ in length, so the dispatcher cannot
    concatenate them) - each process then packs the stream and ``IterableDatasetShard`` deals
    rows round-robin, as :func:`replica_order` assumes.
    """

    _KEEP_WINDOWS = 2  # window-boundary snapshots kept at least, to rewind past a prefetching loader

    def __init__(self, source: Iterable[Mapping[str, Any]], config: PackingConfig, *,
                 window_size: int | None = None, num_replicas: int = 1, cost_model: CostModel | None = None,
                 even_batches: bool = True) -> None:
        _check_common(config, window_size, num_replicas)
        if isinstance(source, (str, bytes, Mapping)) or not hasattr(source, "__iter__"):
            raise TypeError(f"source must be a re-iterable of samples (a list or datasets.IterableDataset of dicts "
                            f"with 'input_ids'), got {type(source).__name__}")
        check_reiterable(source)
        for name, flag in (("even_batches", even_batches),):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{name}={flag!r} must be True or False (set {name})")
        self.source = source
        self.config = config
        self.cost_model = cost_model
        self.window_size = window_size
        self.num_replicas = int(num_replicas)
        self.even_batches = bool(even_batches)
        parts = _config_parts(config, cost_model, window_size=window_size, num_replicas=self.num_replicas,
                              even_batches=self.even_batches)
        self.fingerprint = _fingerprint(**parts)
        #: the settings behind the fingerprint, by name (a refused state names those that differ)
        self.settings = json.loads(json.dumps(parts, default=str))
        self._roll_over = False
        self._first_rank = is_first_rank()  # (its warnings shown there only; a spawned worker has no process group)
        # rows yielded in DataLoader workers since this process last iterated or loaded a state: shared
        # memory, so the main process sees what a worker's copy did (fork, spawn and forkserver alike)
        self._worker_rows = _shared_counter()
        self._reset()

    def _reset(self, epoch: int = 0) -> None:
        self._planner = WindowPlanner(self.config, self.cost_model, window_size=self.window_size,
                                       num_replicas=self.num_replicas, even_batches=self.even_batches)
        self._st: dict[str, Any] = {"epoch": int(epoch), "consumed": 0, "exhausted": False, "num_rows": 0,
                                    "num_empty_skipped": 0, "pending": [], "data": {}, "remaining": {},
                                    "lookahead": []}
        self._snapshots = [self._snapshot()]
        self._resumed = False

    @property
    def num_empty_skipped(self) -> int:
        return int(self._st["num_empty_skipped"])

    @property
    def epoch(self) -> int:
        """The pass being read (0 first): each ``iter()`` after a finished pass starts the next."""
        return int(self._st["epoch"])

    @property
    def num_rows(self) -> int:
        """Rows yielded so far in this pass."""
        return int(self._st["num_rows"])

    def _snapshot(self) -> dict[str, Any]:
        st = self._st
        return {**st, "pending": list(st["pending"]), "data": dict(st["data"]),
                "remaining": dict(st["remaining"]), "lookahead": list(st["lookahead"]),
                "planner": self._planner.state_dict()}

    def _open_source(self) -> Iterator[Mapping[str, Any]]:
        n, epoch = self._st["consumed"], self._st["epoch"]
        _set_source_epoch(self.source, epoch)
        # datasets' skip() returns a stream at epoch 0 (its shuffle order), and set_epoch on it does not give
        # the epoch's order back (datasets 5.2): in a later pass the consumed samples are read and discarded
        if n and _is_hf_iterable(self.source) and epoch == 0:
            return iter(self.source.skip(n))
        return itertools.islice(iter(self.source), n, None)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ValueError(
                f"PackedIterableDataset is a sequential, stateful packer; it cannot run in {info.num_workers} "
                "DataLoader workers (set num_workers to 0 or 1)"
            )
        if info is None:
            self._worker_rows.zero_()  # iterated in this process: its state is the one to save again
            yield from self._iter_rows()
            return
        for row in self._iter_rows():
            self._worker_rows += 1  # the main process sees it: its state_dict() warns it is stale
            yield row

    def _iter_rows(self) -> Iterator[dict[str, Any]]:
        roll, self._roll_over = self._roll_over and self._resumed, False
        yielded = False
        for row in self._iter_pass():
            yielded = True
            yield row
        if roll and not yielded:  # the restored pass had nothing left: on to the next one
            yield from self._iter_pass()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        rows = state.get("_worker_rows")
        if rows is None or not rows.is_shared():  # a copy (pickle, deepcopy): its own counter, shared again
            self._worker_rows = _shared_counter(0 if rows is None else int(rows.item()))

    def _iter_pass(self) -> Iterator[dict[str, Any]]:
        st = self._st
        resumed, self._resumed = self._resumed, False
        if st["exhausted"] and not st["pending"] and not st["lookahead"]:  # a finished pass: the next one
            if resumed:  # ... unless a state saved at the end of the pass was just loaded: nothing is left
                return
            self._reset(epoch=st["epoch"] + 1)
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
            with first_rank_warnings(is_first_rank(self._first_rank)):  # (every rank packs the same stream)
                packs = self._planner.add(ids, lengths, last=st["exhausted"] and not st["lookahead"])
            st["pending"] = [[list(s) for s in p] for p in packs]
            self._keep_snapshot()

    def _keep_snapshot(self) -> None:
        """Add this window's snapshot; drop the oldest ones no rewind of up to
        ``2 x packs_per_window + num_replicas`` rows (a step of every replica plus a
        prefetched round) can need, keeping at least ``_KEEP_WINDOWS``."""
        snaps = self._snapshots + [self._snapshot()]
        reach = snaps[-1]["num_rows"] - (2 * int(self.config.packs_per_window) + self.num_replicas)
        while len(snaps) > self._KEEP_WINDOWS and snaps[1]["num_rows"] <= reach:
            snaps.pop(0)
        self._snapshots = snaps

    def state_dict(self, num_rows: int | None = None) -> dict[str, Any]:
        """JSON-serialisable state after ``num_rows`` rows (default: rows yielded so far).

        Pass ``num_rows`` (rows the training loop consumed) when a prefetching loader has
        drawn rows the loop has not used; it may lie up to one window, and at least
        ``2 x packs_per_window + num_replicas`` rows, back.

        Warns:
            UserWarning: a DataLoader worker process iterated this dataset since this process last
                did (``num_workers=1``): the state lives in the worker, this one is stale.

        Raises:
            InputTypeError: ``num_rows`` not an int (a float, bool or string).
            ValueError: ``num_rows`` outside the rows this object can rewind to.
        """
        if num_rows is not None and not _is_int(num_rows):
            raise InputTypeError(f"num_rows={_short(num_rows)} is invalid: it must be None or an int (rows the "
                                 "training loop consumed)")
        worker_rows = int(self._worker_rows.item())
        if worker_rows and torch.utils.data.get_worker_info() is None:
            warnings.warn(
                f"PackedIterableDataset.state_dict(): a DataLoader worker process yielded {worker_rows} rows of this "
                "dataset since this process last iterated it or loaded a state; the packing state lives in that worker "
                f"and this process' state (consumed={self._st['consumed']}, num_rows={self._st['num_rows']}) does not "
                "count those rows: resuming from it would repeat them. Read the dataset with num_workers=0 "
                "(DataLoader(..., num_workers=0); Trainer: dataloader_num_workers=0) to save and resume it exactly",
                UserWarning, stacklevel=2)
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
        return {"format": _STREAM_FORMAT, "fingerprint": self.fingerprint, "settings": self.settings, **st}

    def load_state_dict(self, state: Mapping[str, Any], *, roll_over: bool = False) -> None:
        """Restore a state from :meth:`state_dict`; the next ``iter()`` continues from it, in its
        pass (and yields nothing when the state was taken at the end of the pass, unless
        ``roll_over``: that ``iter()`` then goes on with the next pass, as a loop that resumes
        in whatever pass the state names - ``Trainer`` - needs).

        The state is checked for internal consistency first (types and ranges of every
        field, every span within its sample, no sample or token twice, the pending packs,
        the planner's reserve, the packer's pool and the look-ahead agreeing with ``data``
        and ``remaining`` token for token); a refused state changes nothing.

        Raises:
            ValueError: a state of another format or packing configuration (names the settings
                that differ, saved and here), with missing or malformed fields, or internally
                inconsistent (names the field).
            InputTypeError: ``roll_over`` not a bool (nothing changes).
        """
        if not isinstance(roll_over, (bool, np.bool_)):
            raise InputTypeError(f"load_state_dict: roll_over={_short(roll_over)} must be True or False (set roll_over)")
        v2 = isinstance(state, Mapping) and state.get("format") == _STREAM_FORMAT_V2
        if not isinstance(state, Mapping) or (state.get("format") != _STREAM_FORMAT and not v2):
            raise ValueError(f"not a PackedIterableDataset state (expected format {_STREAM_FORMAT!r}; states of "
                             "earlier versions than v2 cannot be resumed)")
        if not v2 and not isinstance(state.get("settings"), Mapping):
            raise ValueError("malformed PackedIterableDataset state: field 'settings' is missing or not a mapping (a "
                             "truncated or edited checkpoint?)")
        if state.get("fingerprint") != self.fingerprint:
            diff = [] if v2 else _settings_diff(state["settings"], self.settings)
            named = "; ".join(f"{k} saved {_short(a)}, here {_short(b)}" for k, a, b in diff[:6])
            which = (f": {named}; build the dataset with the saved values to resume it" if named
                     else " (config, cost_model, window_size, num_replicas, even_batches)")
            raise ValueError(f"stream state fingerprint {_short(state.get('fingerprint'))} != {self.fingerprint!r}: it "
                             f"was saved with different settings{which}")
        st = _parse_stream_state(state, self.config)
        st["epoch"] = 0 if v2 else state_int(state, "epoch", "PackedIterableDataset", 0, 2**62)
        probe = WindowPlanner(self.config, self.cost_model, window_size=self.window_size,
                              num_replicas=self.num_replicas, even_batches=self.even_batches)
        probe.load_state_dict(state["planner"])  # checks the planner and packer states fully
        _check_stream_tokens(st, probe, self.config)
        self._planner = probe
        self._st = st
        self._resumed = True
        self._roll_over = bool(roll_over)
        self._worker_rows.zero_()  # the state is now the loaded one
        self._snapshots = [self._snapshot()]


def _shared_counter(value: int = 0) -> torch.Tensor:
    """A one-int64 tensor in shared memory (a DataLoader worker's writes reach this process); a private
    one where shared memory cannot be had (then :meth:`PackedIterableDataset.state_dict` cannot warn)."""
    counter = torch.full((1,), value, dtype=torch.int64)
    try:
        return counter.share_memory_()
    except RuntimeError:  # pragma: no cover - no /dev/shm (a locked-down container)
        return counter


def _settings_diff(saved: Any, here: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(name, saved, here)`` for every setting that differs (nested mappings by dotted name)."""
    if not isinstance(saved, Mapping):
        return [(prefix or "settings", saved, dict(here))]
    out = []
    for key in sorted(set(saved) | set(here), key=str):
        a, b = saved.get(key, "<missing>"), here.get(key, "<missing>")
        name = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _settings_diff(a, b, name + ".")
        elif a != b:
            out.append((name, a, b))
    return out


def _set_source_epoch(source: Any, epoch: int) -> None:
    """``set_epoch(epoch)`` on the source, or on the stream a wrapper (``.source``) reads, where one has it."""
    for obj in (source, getattr(source, "source", None)):
        if obj is not None and callable(getattr(obj, "set_epoch", None)):
            obj.set_epoch(int(epoch))
            return


def _parse_stream_state(state: Mapping[str, Any], config: PackingConfig) -> dict[str, Any]:
    """The stream's own fields, typed and range-checked (``ValueError`` naming the field)."""
    what = "PackedIterableDataset"
    consumed = state_int(state, "consumed", what, 0, 2**62)
    st: dict[str, Any] = {
        "consumed": consumed, "exhausted": state_bool(state, "exhausted", what),
        "num_rows": state_int(state, "num_rows", what, 0, 2**62),
        "num_empty_skipped": state_int(state, "num_empty_skipped", what, 0, consumed),
    }
    if "planner" not in state:
        raise ValueError(f"malformed {what} state: field 'planner' is missing (a truncated or edited checkpoint?)")
    data: dict[int, dict[str, Any]] = {}
    for k, entry in enumerate(state_list(state, "data", what)):
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise ValueError(f"malformed {what} state: data[{k}] = {_short(entry)} must be [sample, input_ids, labels]")
        sid = state_value_int(entry[0], f"data[{k}] sample", what, 0, consumed - 1)
        if sid in data:
            raise ValueError(f"malformed {what} state: data[{k}]: sample {sid} appears twice")
        try:
            ids = check_token_ids(entry[1], where=f"state data[{k}] (sample {sid})", field="input_ids").tolist()
            labels = None if entry[2] is None else check_token_ids(
                entry[2], where=f"state data[{k}] (sample {sid})", field="labels").tolist()
        except (TypeError, ValueError) as e:
            raise ValueError(f"malformed {what} state: {e}") from None
        if not ids or (labels is not None and len(labels) != len(ids)):
            raise ValueError(f"malformed {what} state: data[{k}] (sample {sid}) has {len(ids)} input_ids and "
                             f"{'no' if labels is None else len(labels)} labels (non-empty, equal lengths)")
        data[sid] = {"input_ids": ids, "labels": labels}
    remaining: dict[int, int] = {}
    for k, entry in enumerate(state_list(state, "remaining", what)):
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise ValueError(f"malformed {what} state: remaining[{k}] = {_short(entry)} must be [sample, tokens]")
        sid = state_value_int(entry[0], f"remaining[{k}] sample", what, 0, consumed - 1)
        if sid in remaining:
            raise ValueError(f"malformed {what} state: remaining[{k}]: sample {sid} appears twice")
        remaining[sid] = state_value_int(entry[1], f"remaining[{k}] tokens", what, 1, MAX_LENGTH)
    if set(remaining) != set(data):
        odd = sorted(set(remaining) ^ set(data))[:5]
        raise ValueError(f"malformed {what} state: 'data' and 'remaining' disagree on samples {odd} (every sample "
                         "not yet fully yielded has both)")
    lookahead = [state_value_int(x, f"lookahead[{k}]", what, 0, consumed - 1)
                 for k, x in enumerate(state_list(state, "lookahead", what))]
    if len(set(lookahead)) != len(lookahead) or not set(lookahead) <= set(data):
        raise ValueError(f"malformed {what} state: 'lookahead' = {_short(lookahead)} must list distinct samples "
                         "held in 'data'")
    pending = [state_spans(p, f"pending[{i}]", what) for i, p in enumerate(state_list(state, "pending", what))]
    for i, p in enumerate(pending):
        if sum(e - s for _, s, e in p) > config.max_tokens:
            raise ValueError(f"malformed {what} state: pending[{i}] holds more than max_tokens={config.max_tokens} "
                             "tokens")
    st.update(pending=[[list(sp) for sp in p] for p in pending], data=data, remaining=remaining, lookahead=lookahead)
    return st


def _check_stream_tokens(st: dict[str, Any], planner: WindowPlanner, config: PackingConfig) -> None:
    """Token conservation: each held sample's ``remaining`` equals the tokens of its spans
    still to yield (pending packs, the planner's reserve, the packer's pool, or the whole
    kept sample while it waits in the look-ahead), spans lie within the kept sample and
    never overlap."""
    what = "PackedIterableDataset"
    cap = int(config.max_tokens)
    kept = {sid: len(d["input_ids"]) if config.overlength != "truncate" else min(len(d["input_ids"]), cap)
            for sid, d in st["data"].items()}
    spans: dict[int, list[tuple[int, int, str]]] = {}
    for where, packs in (("pending", st["pending"]), ("the planner's reserve", planner.reserve)):
        for p in packs:
            for sid, s, e in p:
                spans.setdefault(int(sid), []).append((int(s), int(e), where))
    for sid, s, e in planner.packer.carried_spans:
        spans.setdefault(sid, []).append((s, e, "the packer's pool"))
    for sid in st["lookahead"]:
        spans.setdefault(sid, []).append((0, kept[sid], "lookahead"))
    for sid, sp in spans.items():
        if sid not in st["data"]:
            raise ValueError(f"malformed {what} state: {sp[0][2]} holds sample {sid}, which is not in 'data' "
                             "(its tokens are lost)")
        sp.sort()
        if sp[-1][1] > kept[sid]:
            raise ValueError(f"malformed {what} state: {sp[-1][2]} holds tokens [{sp[-1][0]}, {sp[-1][1]}) of sample "
                             f"{sid}, which has {kept[sid]} (a truncated 'data' entry?)")
        for (_s0, e0, _w0), (s1, _e1, w1) in zip(sp, sp[1:]):
            if s1 < e0:
                raise ValueError(f"malformed {what} state: {w1} repeats tokens of sample {sid} (the same tokens "
                                 "twice)")
    for sid, left in st["remaining"].items():
        held = sum(e - s for s, e, _w in spans.get(sid, []))
        if held != left:
            raise ValueError(f"malformed {what} state: 'remaining' says sample {sid} has {left} tokens to yield, but "
                             f"the pending packs, reserve, pool and look-ahead hold {held}")


def _is_hf_iterable(source: Any) -> bool:
    try:
        from datasets import IterableDataset as HFIterableDataset
    except ImportError:  # pragma: no cover - datasets is a dependency
        return False
    return isinstance(source, HFIterableDataset)


def _sample_tokens(sample: Any, sid: int) -> tuple[list[int], list[int] | None]:
    if not isinstance(sample, Mapping) or "input_ids" not in sample:
        found = sorted(map(str, sample))[:20] if isinstance(sample, Mapping) else type(sample).__name__
        raise ValueError(
            f"source sample {sid} has no 'input_ids'; found: {found} "
            "(tokenize the text, or rename the token column to 'input_ids')"
        )
    ids = check_token_ids(sample["input_ids"], where=f"source sample {sid}", field="input_ids").tolist()
    labels = sample.get("labels")
    if labels is not None:
        labels = check_token_ids(labels, where=f"source sample {sid}", field="labels").tolist()
        if len(labels) != len(ids):
            raise ValueError(f"source sample {sid}: labels has {len(labels)} entries but input_ids has {len(ids)} "
                             "(give every token a label, or drop the labels column)")
    if len(ids) > MAX_LENGTH:
        raise ValueError(f"source sample {sid} has {len(ids)} tokens, more than {MAX_LENGTH}")
    return ids, labels


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
