"""_hf_compat (6): the references that keep destroyed process groups (and a gloo backend's
threads) alive until interpreter teardown are dropped at exit, and only once the group is gone."""

import os
import tempfile

import torch.distributed as dist

from atac_hf.integrations import _hf_compat
from atac_hf.integrations._hf_compat import release_groups_after_shutdown, track_group_holder


class _Holder:
    def __init__(self):
        self.cp_group = object()
        self.tp_group = object()
        self.other = object()


class _EqHolder:  # a dataclass-like holder: defines __eq__, so it does not hash
    __hash__ = None

    def __init__(self):
        self.device_mesh = object()

    def __eq__(self, other):
        return True


def test_release_drops_tracked_group_attributes_only():
    holder, eq_holder = _Holder(), _EqHolder()
    track_group_holder(holder)
    track_group_holder(eq_holder)
    assert _hf_compat._REGISTERED
    other = holder.other
    assert release_groups_after_shutdown() is True
    assert holder.cp_group is None and holder.tp_group is None and eq_holder.device_mesh is None
    assert holder.other is other
    assert release_groups_after_shutdown() is False  # nothing left: a second call changes nothing


def test_release_only_drains_while_the_process_group_lives(monkeypatch):
    """A script that exits with the process group alive: nothing is dropped, but gloo's workers are drained
    (a worker freeing the last collective at finalization aborted a 2-rank run: _hf_compat 8)."""
    drains = []
    monkeypatch.setattr(_hf_compat, "drain_gloo_workers", lambda *a: drains.append(dist.is_initialized()))
    init = os.path.join(tempfile.mkdtemp(), "init")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    try:
        holder = _Holder()
        track_group_holder(holder)
        group = holder.cp_group
        assert release_groups_after_shutdown() is False
        assert holder.cp_group is group
        assert drains == [True]
    finally:
        dist.destroy_process_group()
    assert release_groups_after_shutdown() is True
    assert holder.cp_group is None


def test_holders_are_not_kept_alive():
    import gc
    import weakref

    holder = _Holder()
    track_group_holder(holder)
    ref = weakref.ref(holder)
    del holder
    gc.collect()
    assert ref() is None
    assert all(h is not None for h in _hf_compat._GROUP_HOLDERS.values())



def test_drain_gives_other_threads_the_gil():
    """_hf_compat (8): while ``drain_gloo_workers`` runs, a thread that needs the GIL (as a gloo worker
    freeing a collective's tensors does) gets it; the drain lasts about its seconds."""
    import threading
    import time

    from atac_hf.integrations._hf_compat import drain_gloo_workers

    ran = threading.Event()
    t = threading.Thread(target=ran.set)
    t0 = time.monotonic()
    t.start()
    drain_gloo_workers(0.05)
    assert ran.is_set()
    t.join()
    assert time.monotonic() - t0 >= 0.05


def test_release_train_and_end_training_drain_first(monkeypatch):
    """The drain runs in release_groups_after_shutdown before any reference is dropped, at the end of
    ATACTrainer.train (even when training raises) and around ATACAccelerator.end_training."""
    from atac_hf.integrations import accelerate as acc_mod
    from atac_hf.integrations import trainer as trainer_mod

    calls = []
    holder = _Holder()
    track_group_holder(holder)
    monkeypatch.setattr(_hf_compat, "drain_gloo_workers", lambda *a: calls.append(holder.cp_group is not None))
    assert release_groups_after_shutdown() is True
    assert calls == [True]  # drained while the groups were still held

    calls.clear()
    monkeypatch.setattr(trainer_mod, "drain_gloo_workers", lambda *a: calls.append("train"))

    def boom(self, *a, **k):
        raise RuntimeError("training failed")

    monkeypatch.setattr(trainer_mod.Trainer, "train", boom)
    fake = object.__new__(trainer_mod.ATACTrainer)  # no model: only train's own steps run
    fake.train_dataset, fake._atac_stream_end_train = [], lambda: None
    try:
        trainer_mod.ATACTrainer.train(fake)
    except RuntimeError:
        pass
    assert calls == ["train"]

    calls.clear()
    monkeypatch.setattr(acc_mod, "drain_gloo_workers", lambda *a: calls.append("drain"))
    monkeypatch.setattr(acc_mod.Accelerator, "end_training", lambda self: calls.append("end"))
    acc_mod.ATACAccelerator.end_training(object.__new__(acc_mod.ATACAccelerator))
    assert calls == ["drain", "end", "drain"]


def test_a_trainers_accelerator_drains_around_end_training(monkeypatch):
    """ATACTrainer's Accelerator is Accelerate's own: track_group_holder(trainer, accelerator) wraps its
    end_training (drain, end, drain), once however often it is tracked."""
    calls = []

    class _Acc:
        def end_training(self):
            calls.append("end")

    acc = _Acc()
    monkeypatch.setattr(_hf_compat, "drain_gloo_workers", lambda *a: calls.append("drain"))
    track_group_holder(_Holder(), acc)
    track_group_holder(_Holder(), acc)
    acc.end_training()
    assert calls == ["drain", "end", "drain"]
