"""Version workarounds, in one place. Each says when it can go.

Nothing here patches another library: these are small adapters the rest of the
package calls instead of the moving upstream API.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["all_gather_single", "reduce_scatter_single", "rope_types"]

# torch 2.13 renamed the single-tensor collectives and deprecated the old names
# (``all_gather_into_tensor``/``reduce_scatter_tensor`` warn on every call).
# Can go when pyproject requires torch >= 2.13.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def rope_types(config: Any) -> list[str]:
    """RoPE types a config uses (``"default"`` when it declares none).

    Transformers 5 keeps them in ``config.rope_parameters`` (one dict, or one dict per
    layer type, e.g. ``{"full_attention": {...}, "sliding_attention": {...}}``);
    4.x and some remote-code configs use ``rope_scaling`` with ``type`` or
    ``rope_type``. Reading ``rope_scaling`` can go when no supported transformers
    version or checkpoint format carries it (pyproject already requires >= 5.0, but
    remote-code configs still set it).
    """
    found: list[str] = []
    for attr in ("rope_parameters", "rope_scaling"):
        params = getattr(config, attr, None)
        if not isinstance(params, dict):
            continue
        dicts = [params] if ("rope_type" in params or "type" in params) else [
            v for v in params.values() if isinstance(v, dict)
        ]
        for d in dicts:
            t = d.get("rope_type", d.get("type"))
            if t is not None:
                found.append(str(t))
    return found or ["default"]
