"""benchmarks/bench_decode_limit.py: the rows its products run are a batched beam search's (the prompts'
tokens in one prefill, then users x beams rows for each later SID token), and bad shapes are refused."""

from __future__ import annotations

import pytest
import torch

from benchmarks import bench_decode_limit


def test_a_search_runs_the_prefill_then_one_product_per_later_sid_token():
    assert bench_decode_limit.search_rows([90, 95, 80], beams=20, levels=4) == [265, 60, 60, 60]
    assert bench_decode_limit.search_rows([7], beams=1, levels=1) == [7]  # one level: the prefill decides
    for prompts, beams, levels in (([], 20, 4), ([5], 0, 4), ([5], 20, 0)):
        with pytest.raises(ValueError, match="a search needs"):
            bench_decode_limit.search_rows(prompts, beams=beams, levels=levels)


def test_the_limit_runs_every_layer_s_forward_product_for_each_row_count():
    shapes = [(12, 8), (8, 12), (5, 8)]  # layers of other widths: each gets inputs of its own width
    assert bench_decode_limit.forward_products_seconds(shapes, [5, 3, 3], torch.float32, repeats=2) > 0
