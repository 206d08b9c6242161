"""Tests that kill the mutmut survivors in ``atac_hf/sharding/api.py`` (issue 20):
``plan_shards``' refusals show the offending value cut short (huge ints as their bit count,
long reprs cut at 57 characters, objects by their type name), with the whole message matched.
docs/TESTING.md lists the mutants and verdicts.
"""

from __future__ import annotations

import re

import pytest

from atac_hf.sharding import plan_shards

CP_MSG = "cp_size must be an int >= 1 and <= 4096 (MAX_CP_SIZE), got {} (set cp_size in the ATAC config / --cp-size)"


@pytest.mark.parametrize("cp_size, shown", [
    (10**30, "1" + "0" * 30),  # the largest int shown in full
    (10**30 + 1, "<int of 100 bits>"),
    (10**31, "<int of 103 bits>"),
    ([2], "<list>"),  # not a number or string: its type
    ("a" * 58, "'" + "a" * 58 + "'"),  # a 60-character repr, shown whole
    ("a" * 59, "'" + "a" * 56 + "..."),  # 61 characters: cut to 57 and "..."
])
def test_plan_shards_shows_a_bad_cp_size_cut_short(cp_size, shown):
    """The refused cp_size appears in the message in its short form: in full up to 10**30 and
    60 characters, else as a bit count or cut, and as its type name when it is no scalar."""
    with pytest.raises(ValueError, match="^" + re.escape(CP_MSG.format(shown)) + "$"):
        plan_shards([1], cp_size)
