"""Prompts as token ids (``decode.loops.prompt_input``): the left-padded batch and the EOS id list every loop reads."""

from __future__ import annotations

import pytest
import torch

from decode.loops.prompt_input import id_list, left_pad, pad_id


def test_left_padding_right_aligns_every_prompt_under_its_mask():
    ids, mask = left_pad([[5, 6, 7], torch.tensor([8]), [9, 10]], pad_id=1, device=torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7], [1, 1, 8], [1, 9, 10]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert ids.dtype == mask.dtype == torch.long


@pytest.mark.parametrize(("setting", "ids"), [(None, []), (2, [2]), ([2, 7], [2, 7]), ((3,), [3]),
                                              (torch.tensor([4, 5]), [4, 5])])
def test_an_eos_setting_is_a_list_of_ids(setting, ids):
    assert id_list(setting) == ids and all(type(i) is int for i in id_list(setting))


def test_finished_rows_pad_with_the_pad_id_else_the_first_eos_id_else_zero():
    assert pad_id(3, [2, 7]) == 3 and pad_id(0, 2) == 0
    assert pad_id(None, [2, 7]) == 2 and pad_id(None, 7) == 7 and pad_id(None, None) == 0
