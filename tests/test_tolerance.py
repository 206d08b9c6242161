"""The low-precision exactness rule (``atac_hf.attention.tolerance``), the one the GPU tests
and ``scripts/device_check.py`` apply: it passes a correct kernel in float32 and bfloat16 and
catches one dropped key out of ~700 and a sliding window off by one, forward or backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atac_hf.attention.reference import doc_mask_dense, doc_masked_sdpa_dense
from atac_hf.attention.tolerance import FACTOR, check_against_plain, check_errors, max_abs_error

LENS = [700, 40, 1, 90, 3]  # one long document: a dropped key is one of ~700


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread


def _kernel(q, k, v, lens, window=None, *, drop_key=None, window_shift=0):
    """A kernel in the style of the flash kernels: inputs in a low-precision dtype, computed in
    float32 (float64 for float64 inputs), output rounded to the input dtype. Its planted bugs:
    ``drop_key=(doc, key, from_row)`` hides one key from the rows ``>= from_row`` of a document
    (a chunk whose key prefix misses a row); ``window_shift`` widens the window by that many keys."""
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    H, K = q.shape[0], k.shape[0]
    outs, off = [], 0
    for d, n in enumerate(lens):
        qs, ks, vs = (t[:, off:off + n].to(work) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(H // K, 0), vs.repeat_interleave(H // K, 0)
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        m = j <= i
        if window is not None:
            m &= j > i - (window + window_shift)
        if drop_key is not None and drop_key[0] == d:
            m &= ~((j == drop_key[1]) & (i >= drop_key[2]))
        s = (qs @ ks.transpose(1, 2)) * q.shape[-1] ** -0.5
        outs.append((torch.softmax(s.masked_fill(~m, float("-inf")), -1) @ vs).to(q.dtype))
        off += n
    return torch.cat(outs, dim=1).transpose(0, 1)  # (N, H, D)


def _run(fn, q, k, v, gout):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return (out, *torch.autograd.grad(out, leaves, gout))


def _case(dtype, window=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = sum(LENS)
    q, k, v = (torch.randn(h, N, 32, generator=g, dtype=torch.float64) for h in (8, 4, 4))
    gout = torch.randn(N, 8, 32, generator=g, dtype=torch.float64)
    ref = _run(lambda a, b, c: _kernel(a, b, c, LENS, window), q, k, v, gout)
    low = [t.to(dtype) for t in (q, k, v)]
    mask = doc_mask_dense(LENS, "cpu", window)
    plain = _run(lambda a, b, c: doc_masked_sdpa_dense(a, b, c, LENS, mask=mask), *low, gout.to(dtype))
    return low, gout.to(dtype), ref, plain


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rule_passes_a_correct_kernel_and_catches_planted_bugs(dtype):
    for window in (None, 64):
        low, gout, ref, plain = _case(dtype, window)
        good = _run(lambda a, b, c: _kernel(a, b, c, LENS, window), *low, gout)
        checks = check_against_plain(good, plain, ref)
        assert all(c.ok for c in checks), checks
        assert all(0 < c.plain_err and c.err <= FACTOR * c.plain_err for c in checks)  # not passing on the floor
        bugs = {"one key of ~700 hidden from the second half of the document":
                dict(drop_key=(0, 300, 350)),
                "the first key of the document hidden from its last rows": dict(drop_key=(0, 0, 600))}
        if window is not None:
            bugs["window one key too wide"] = dict(window_shift=1)
            bugs["window one key too narrow"] = dict(window_shift=-1)
        else:
            bugs["the key 100 rows back hidden from one row"] = dict(drop_key=(0, 550, 650))
        for name, bug in bugs.items():
            if window is not None and "drop_key" in bug:
                d, key, row = bug["drop_key"]
                bug = dict(drop_key=(d, row + 10 - window // 2, row + 10))  # a key inside the window
            bad = _run(lambda a, b, c: _kernel(a, b, c, LENS, window, **bug), *low, gout)
            checks = check_against_plain(bad, plain, ref)
            assert not all(c.ok for c in checks), (dtype, window, name, checks)


def test_rule_on_numbers():
    ok, bad, exact = check_errors([1.0, 2.1, 0.0], [0.5, 1.0, 0.0], [1.0, 1.0, 1.0], torch.bfloat16,
                                  names=("out", "dq", "dk"))
    assert ok.ok and ok.ratio == 2.0 and ok.bound == pytest.approx(1.0 + torch.finfo(torch.bfloat16).eps / 64)
    assert not bad.ok and bad.ratio == pytest.approx(2.1)
    assert exact.ok and exact.ratio == 0.0
    floor = check_errors([1e-9], [0.0], [4.0], torch.float32, names=("out",))[0]
    assert floor.ok and floor.ratio == float("inf")  # plain exact, kernel within the floor (eps * 4 / 64)
    assert not check_errors([1e-7], [0.0], [4.0], torch.float32, names=("out",))[0].ok
    assert check_errors([3.0], [1.0], [1.0], torch.float32, names=("out",), factor=3.0)[0].ok


def test_rule_refusals():
    with pytest.raises(ValueError, match="need one value per tensor: 1 errors, 2 plain errors"):
        check_errors([1.0], [1.0, 2.0], [1.0], torch.float32, names=("out",))
    with pytest.raises(ValueError, match="dtype torch.int32 is not a floating-point dtype"):
        check_errors([1.0], [1.0], [1.0], torch.int32, names=("out",))
    x = torch.zeros(3)
    with pytest.raises(ValueError, match=r"shapes differ: \(3,\) vs reference \(4,\)"):
        max_abs_error(x, torch.zeros(4))
    with pytest.raises(ValueError, match=r"must run in one dtype, got \['torch.bfloat16', 'torch.float32'\]"):
        check_against_plain([x], [x.bfloat16()], [x.double()], names=("out",))
    with pytest.raises(ValueError, match=r"need one tensor per name \['out', 'dq', 'dk', 'dv'\]"):
        check_against_plain([x], [x], [x.double()])
    assert max_abs_error(torch.zeros(0), torch.zeros(0)) == 0.0
    assert np.isclose(max_abs_error(torch.ones(2), torch.zeros(2, dtype=torch.float64)), 1.0)
