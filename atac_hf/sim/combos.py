"""Which packing x sharding combinations a run simulates: ``--combos`` parsing and checks.

Numpy-free.
"""

from __future__ import annotations

from typing import Sequence

from .results import NAMED_COMBINATIONS, PACKINGS, SHARDINGS, combo_label

__all__ = ["COMBOS_FORM", "check_combos", "parse_combos"]

#: The legal form of ``--combos`` (every error about it ends with this).
COMBOS_FORM = (f"--combos takes 'all', 'named' or comma-separated entries, each a name from "
               f"{list(NAMED_COMBINATIONS)} or packing+sharding (e.g. wfap+atp), each combination once; "
               f"packings {list(PACKINGS)}, shardings {list(SHARDINGS)}")


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")


def _cut(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def _folded(text: str) -> str:
    return " ".join(text.lower().split())


def _suggest(item: str) -> str:
    """`` (did you mean 'X'?)`` where ``item`` differs from a legal entry only in case or spacing."""
    want = _folded(item).replace(" + ", "+").replace(" +", "+").replace("+ ", "+")
    legal = ["all", "named", *NAMED_COMBINATIONS, *(f"{p}+{s}" for p in PACKINGS for s in SHARDINGS)]
    hit = next((x for x in legal if _folded(x) == want), None)
    return f" (did you mean {hit!r}?)" if hit else ""


def parse_combos(spec: str, setting: str = "--combos") -> list[tuple[str, str]] | None:
    """``--combos`` as ``(packing, sharding)`` pairs (None: ``all``).

    Spaces around entries and around ``+`` are ignored; names are case-sensitive.

    Raises:
        ValueError: an empty value or entry, an unknown name, packing or sharding, ``all`` or
            ``named`` inside a list, or a combination given twice (by name or pair): the
            message names the bad entry, the legal values and ``setting``.
    """
    text = str(spec).strip()
    if text == "all":
        return None
    if text == "named":
        return list(NAMED_COMBINATIONS.values())
    if not text:
        raise ValueError(f"{setting} {_short(str(spec))} is empty; {COMBOS_FORM}")
    out: list[tuple[str, str]] = []
    given: dict[tuple[str, str], str] = {}
    for i, raw in enumerate(text.split(","), 1):
        item = raw.strip()
        if not item:
            raise ValueError(f"{setting} {_short(text)}: entry {i} is empty (a stray comma?); {COMBOS_FORM}")
        where = f"{setting} entry {_short(item)} (number {i} of {_short(text)})"
        if item in ("all", "named"):
            raise ValueError(f"{where} must be the whole value, not one entry of a list; {COMBOS_FORM}")
        if item in NAMED_COMBINATIONS:
            pair = NAMED_COMBINATIONS[item]
        elif "+" in item:
            p, s = (x.strip() for x in item.split("+", 1))
            bad = ([f"unknown packing {_short(p)}"] * (p not in PACKINGS)
                   + [f"unknown sharding {_short(s)}"] * (s not in SHARDINGS))
            if bad:
                raise ValueError(f"{where}: {' and '.join(bad)}{_suggest(item)}; {COMBOS_FORM}")
            pair = (p, s)
        else:
            raise ValueError(f"{where} is neither a combination name nor packing+sharding{_suggest(item)}; "
                             f"{COMBOS_FORM}")
        if pair in given:
            again = "" if given[pair] == item else f" (as {given[pair]!r} before; both are {'+'.join(pair)})"
            raise ValueError(f"{where} duplicates an earlier entry{again}; {COMBOS_FORM}")
        given[pair] = item
        out.append(pair)
    return out


def check_combos(combos: Sequence[tuple[str, str] | str] | str) -> list[tuple[str, str]]:
    """``combos`` as a list of known, distinct ``(packing, sharding)`` pairs (:func:`~.simulate.simulate`).

    Each entry is a ``(packing, sharding)`` pair, a combination name (``"ATAC"``) or a
    ``"packing+sharding"`` label (``"wfap+atp"``); a whole str is read as ``--combos`` reads it
    (``"all"``, ``"named"`` or comma-separated entries).

    Raises:
        ValueError: empty, an unknown packing, sharding or name, an entry that is neither a pair nor
            a str, or a pair given twice.
    """
    if isinstance(combos, str):
        parsed = parse_combos(combos, "combos")
        return [(p, s) for p in PACKINGS for s in SHARDINGS] if parsed is None else parsed
    if not hasattr(combos, "__iter__") or isinstance(combos, (bytes, dict)):
        raise TypeError(f"combos={_cut(repr(combos))} is not a list: combos must be a list of (packing, sharding) "
                        f"pairs or names; packings {list(PACKINGS)}, shardings {list(SHARDINGS)}")
    out: list[tuple] = []
    for c in combos:
        if isinstance(c, str):
            if c.strip() in ("all", "named") or "," in c:
                raise ValueError(f"combos entry {_short(c)} must be one combination (a name such as 'ATAC' or "
                                 f"packing+sharding, e.g. 'wfap+atp'); pass combos={_short(c)} itself for a list")
            out.extend(parse_combos(c, "combos entry") or [])
        elif isinstance(c, (tuple, list)):
            out.append(tuple(c))
        else:
            raise ValueError(f"combos entry {_cut(repr(c))} is neither a (packing, sharding) pair nor a name; "
                             f"names {list(NAMED_COMBINATIONS)} or packing+sharding; packings {list(PACKINGS)}, "
                             f"shardings {list(SHARDINGS)}")
    if not out:
        raise ValueError("combos is empty: give at least one (packing, sharding) pair")
    seen: set[tuple] = set()
    for c in out:
        if len(c) != 2 or c[0] not in PACKINGS or c[1] not in SHARDINGS:
            raise ValueError(f"unknown combination {_cut(repr(c))}; packings {list(PACKINGS)}, shardings "
                             f"{list(SHARDINGS)} (or a name from {list(NAMED_COMBINATIONS)}, or 'packing+sharding')")
        if c in seen:
            raise ValueError(f"combination {c!r} ({combo_label(*c)}) is given twice in combos; give each "
                             "(packing, sharding) pair once")
        seen.add(c)
    return out  # type: ignore[return-value]
