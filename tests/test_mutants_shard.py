"""Tests that kill the mutmut survivors in ``atac_hf/attention/shard.py``'s input forms (issue 20):
how ``doc_lengths_from_batch`` reads ``seq_lengths``, ``cu_seqlens`` / ``cu_seq_lens_q`` and
``position_ids`` (``_lengths_from_seq_lengths``, ``_lengths_from_cu``, ``_check_positions``).

Every result is asserted with its dtype (an int64 array: ``[3.0] == [3]`` in Python, so a
float result would pass a ``tolist()`` comparison) and every error with its whole message
(``fullmatch``), so that a changed word, index or slice in a message is caught.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atac_hf.attention import doc_lengths_from_batch


def _ids(B: int, S: int) -> torch.Tensor:
    return torch.zeros(B, S, dtype=torch.long)


def _pos(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor([[i for n in r for i in range(n)] for r in rows])


def _lengths(batch: dict) -> list[int]:
    out = doc_lengths_from_batch(batch)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64
    return out.tolist()


def _raises(batch: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        doc_lengths_from_batch(batch)
    assert str(e.value) == message


# ---------------------------------------------------------------------------- seq_lengths
def test_seq_lengths_forms_give_int64_lengths():
    b1 = {"input_ids": _ids(1, 7)}
    assert _lengths({**b1, "seq_lengths": [2, 5]}) == [2, 5]  # flat list, one row
    assert _lengths({**b1, "seq_lengths": [[2, 5]]}) == [2, 5]  # per-row lists, one row
    assert _lengths({**b1, "seq_lengths": torch.tensor([2, 5])}) == [2, 5]  # 1-D tensor, one row
    assert _lengths({**b1, "seq_lengths": [np.array([2, 5])]}) == [2, 5]
    assert _lengths({**b1, "seq_lengths": [2.0, 5.0]}) == [2, 5]
    assert _lengths({**b1, "seq_lengths": [torch.tensor([[2, 5]])]}) == [2, 5]  # a row as a (1, k) tensor
    b2 = {"input_ids": _ids(2, 7)}
    assert _lengths({**b2, "seq_lengths": [[2, 5], [7]]}) == [2, 5, 7]
    assert _lengths({**b2, "seq_lengths": torch.tensor([[2, 5], [7, 0]])}) == [2, 5, 7]  # trailing padding


def test_seq_lengths_tensor_keeps_a_leading_zero_as_an_empty_document():
    # only trailing zeros are padding; a leading 0 is a document of length 0
    _raises({"input_ids": _ids(1, 7), "seq_lengths": torch.tensor([[0, 3, 4]])},
            "seq_lengths of row 0: document 0 has length 0; every document needs >= 1 token "
            "(drop empty documents before packing)")


def test_seq_lengths_flat_list_for_two_rows_is_four_rows():
    # a flat list is one row only when the batch has one row
    _raises({"input_ids": _ids(2, 7), "seq_lengths": [3, 4, 5, 2]}, "'seq_lengths' describes 4 rows, the batch has 2")
    _raises({"input_ids": _ids(1, 7), "seq_lengths": []}, "'seq_lengths' describes 0 rows, the batch has 1")


def test_seq_lengths_errors_name_the_row():
    b = {"input_ids": _ids(2, 7)}
    _raises({**b, "seq_lengths": [[3, 4], [7, 0, 0]]},
            "seq_lengths of row 1: document 1 has length 0; every document needs >= 1 token "
            "(drop empty documents before packing)")
    _raises({**b, "seq_lengths": [[3, 4], [4, 2]]}, "seq_lengths of row 1 sum to 6, the row has 7 tokens")


# ---------------------------------------------------------------------------- cu_seqlens
def test_cu_seqlens_forms_give_int64_lengths():
    b = {"input_ids": _ids(2, 4)}
    assert _lengths({"input_ids": _ids(1, 7), "cu_seqlens": [0, 7]}) == [7]  # one document
    assert _lengths({**b, "cu_seqlens": [0, 1, 4, 8]}) == [1, 3, 4]
    assert _lengths({**b, "cu_seqlens": torch.tensor([0, 1, 4, 8], dtype=torch.int32)}) == [1, 3, 4]
    assert _lengths({**b, "cu_seqlens": torch.tensor([[0, 1, 4, 8]])}) == [1, 3, 4]  # any shape, flattened
    assert _lengths({**b, "cu_seq_lens_q": torch.tensor([0, 1, 4, 8])}) == [1, 3, 4]  # without position_ids
    # cu_seqlens wins over cu_seq_lens_q; seq_lengths over both
    assert _lengths({**b, "cu_seqlens": [0, 2, 4, 8], "cu_seq_lens_q": [0, 1, 4, 8]}) == [2, 2, 4]
    assert _lengths({**b, "seq_lengths": [[4], [4]], "cu_seqlens": [0, 2, 4, 8]}) == [4, 4]
    assert _lengths({**b, "cu_seqlens": None, "cu_seq_lens_q": [0, 1, 4, 8]}) == [1, 3, 4]


def test_cu_seqlens_must_start_at_0_and_end_at_the_token_count():
    b = {"input_ids": _ids(1, 7)}
    _raises({**b, "cu_seqlens": [1, 3, 7]}, "cu_seqlens must run from 0 to 7 (the batch's token count), got [1, 3, 7]...")
    _raises({**b, "cu_seqlens": [0, 3, 6]}, "cu_seqlens must run from 0 to 7 (the batch's token count), got [0, 3, 6]...")
    _raises({**b, "cu_seqlens": [0]}, "cu_seqlens must run from 0 to 7 (the batch's token count), got [0]...")
    # the message shows the first 8 entries
    _raises({"input_ids": _ids(1, 20), "cu_seqlens": list(range(10))},
            "cu_seqlens must run from 0 to 20 (the batch's token count), got [0, 1, 2, 3, 4, 5, 6, 7]...")


def test_cu_seqlens_errors_name_the_document_and_the_row():
    _raises({"input_ids": _ids(1, 7), "cu_seqlens": [0, 3, 3, 7]},
            "cu_seqlens: document 1 has length 0; every document needs >= 1 token (drop empty documents before packing)")
    # 3 rows of 4: the document [6, 10) crosses the end of row 1 (token 8)
    _raises({"input_ids": _ids(3, 4), "cu_seqlens": [0, 4, 6, 10, 12]}, "cu_seqlens: a document crosses the end of row 1")
    _raises({"input_ids": _ids(3, 4), "cu_seqlens": [0, 2, 6, 8, 12]}, "cu_seqlens: a document crosses the end of row 0")


# ---------------------------------------------------------------------------- position_ids
def test_position_ids_alone_give_the_lengths():
    pos = _pos([[2, 5], [7]])
    assert _lengths({"position_ids": pos}) == [2, 5, 7]
    assert _lengths({"input_ids": _ids(2, 7), "position_ids": pos.tolist()}) == [2, 5, 7]


def test_a_batch_without_any_document_source_is_refused():
    _raises({"input_ids": _ids(1, 7)},
            "cannot find the documents of the batch: pass 'position_ids', 'seq_lengths' or 'cu_seqlens'")
    _raises({"labels": _ids(1, 7)}, "the batch needs 'input_ids' or 'position_ids' to find its documents")


def test_position_ids_that_restart_inside_a_document():
    # row 1 is one document of 7, its positions restart at column 5: flat tokens 10..13 shown
    pos = _pos([[3, 4], [5, 2]])
    assert pos[1].tolist() == [0, 1, 2, 3, 4, 0, 1]
    _raises({"input_ids": _ids(2, 7), "position_ids": pos, "seq_lengths": [[3, 4], [7]]},
            "row 1: position_ids disagree with the document lengths at column 5 (position_ids restart there but "
            "not the other; positions [3, 4, 0, 1]); position_ids must count 0,1,2,... within each document and "
            "restart at each document start")


def test_position_ids_that_continue_over_a_document_start():
    # one row, documents [1, 6], positions 0..6 do not restart at column 1; the positions shown
    # are clipped to the row: tokens 0..2
    pos = torch.arange(7)[None]
    _raises({"input_ids": _ids(1, 7), "position_ids": pos, "cu_seqlens": [0, 1, 7]},
            "row 0: position_ids disagree with the document lengths at column 1 (a document starts there but "
            "not the other; positions [0, 1, 2]); position_ids must count 0,1,2,... within each document and "
            "restart at each document start")
    # in row 1 the window starts at the row start (token 7), not 2 tokens before the column
    pos2 = torch.cat([torch.arange(7)[None], torch.arange(7)[None]])
    _raises({"input_ids": _ids(2, 7), "position_ids": pos2, "seq_lengths": [[7], [1, 6]]},
            "row 1: position_ids disagree with the document lengths at column 1 (a document starts there but "
            "not the other; positions [0, 1, 2]); position_ids must count 0,1,2,... within each document and "
            "restart at each document start")


def test_positions_continuing_across_rows_are_still_a_row_start():
    # positions need not restart at a row start: every row starts a document
    pos = torch.tensor([[0, 1, 2], [3, 4, 5]])
    assert _lengths({"input_ids": _ids(2, 3), "position_ids": pos}) == [3, 3]
    assert _lengths({"input_ids": _ids(2, 3), "position_ids": pos, "seq_lengths": [[3], [3]]}) == [3, 3]
