"""The first hour of a new user (issue 17): what a fresh script meets first.

``import atac_hf`` registers ``atac_cp``; a custom collator is refused at construction;
the Trainer runs on CPU without ``use_cpu``; ``atac-hf bench`` writes only where told and
says which workload it used; ``simulate`` explains its columns; calibrate reports progress.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

_MODEL = textwrap.dedent("""
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=128)
    """)


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------------- item 1: registration on import
@pytest.mark.parametrize("order", ["atac_hf first", "transformers first"])
def test_import_atac_hf_registers_atac_cp(order):
    first = ("import atac_hf\n"
             "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'import atac_hf imported torch'\n"
             "import transformers\n") if order == "atac_hf first" else \
            ("import transformers, transformers.modeling_utils\nimport atac_hf\n")
    code = "import sys\n" + first + _MODEL + textwrap.dedent("""
        m = AutoModelForCausalLM.from_config(cfg, attn_implementation="atac_cp")
        assert m.config._attn_implementation == "atac_cp", m.config._attn_implementation
        import atac_hf._attention_hook as hook
        assert hook._FINDER not in sys.meta_path, "the hook removes itself once it fired"
        import transformers.modeling_utils as mu
        assert type(mu.__loader__).__name__ != "_RegisteringLoader", "the module keeps its own loader"
        print("ok")
        """)
    r = _py(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_without_the_hook_transformers_refuses_atac_cp():
    """Not vacuous: with the hook taken out, plain transformers does not know the name."""
    code = "import atac_hf, atac_hf._attention_hook as h\nh.remove_hook()\n" + _MODEL + textwrap.dedent("""
        try:
            AutoModelForCausalLM.from_config(cfg, attn_implementation="atac_cp")
        except Exception as e:
            print("refused", type(e).__name__)
        else:
            print("accepted")
        """)
    r = _py(code)
    assert r.returncode == 0 and "refused" in r.stdout, (r.stdout, r.stderr[-2000:])
