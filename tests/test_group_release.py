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


def test_release_does_nothing_while_the_process_group_lives():
    init = os.path.join(tempfile.mkdtemp(), "init")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    try:
        holder = _Holder()
        track_group_holder(holder)
        group = holder.cp_group
        assert release_groups_after_shutdown() is False
        assert holder.cp_group is group
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

