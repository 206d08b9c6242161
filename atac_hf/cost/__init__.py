"""The cost model: token counts -> seconds per layer, forward + backward (numpy only).

* :mod:`.model` - :class:`CostModel` (tile-quantised causal attention work) and the default.
* :mod:`.presets` - hardware and model presets, :class:`ModelDims`.
* :mod:`.profile` - JSON profiles (``atac-hf calibrate`` writes them).
* :mod:`.calibrate` - measure this machine and fit a profile (imports torch when it runs);
  :mod:`.cli` - ``atac-hf calibrate``.
"""

from __future__ import annotations

from .model import CostModel, default_cost_model
from .presets import HARDWARE_PRESETS, MODEL_PRESETS, HardwarePreset, ModelDims
from .profile import PROFILE_FORMAT

__all__ = [
    "CostModel",
    "HardwarePreset",
    "ModelDims",
    "HARDWARE_PRESETS",
    "MODEL_PRESETS",
    "PROFILE_FORMAT",
    "default_cost_model",
]
