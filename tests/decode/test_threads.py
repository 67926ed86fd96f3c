"""One way to set torch's thread count (decode.threads): for the process, or for a block and then restored."""

from __future__ import annotations

import torch

from decode.threads import torch_threads


def test_a_block_sets_the_threads_and_restores_them_nested_or_not():
    before = torch.get_num_threads()
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
        with torch_threads(None):  # left as it is
            assert torch.get_num_threads() == before + 1
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before


def test_a_call_sets_the_threads_from_there_on():
    before = torch.get_num_threads()
    try:
        torch_threads(before + 1)
        assert torch.get_num_threads() == before + 1
        torch_threads(None)
        assert torch.get_num_threads() == before + 1  # negative control: None changes nothing
    finally:
        torch.set_num_threads(before)
