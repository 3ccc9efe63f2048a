"""Continuous batching (``d3d.decode.continuous``) answers each prompt as greedy ar does on it alone."""

from __future__ import annotations

import pytest
import torch

from d3d.decode.continuous import generate_continuous, shared_prefix
from d3d.decode.engines import generate

from test_engines import tiny_target


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 48, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("slots", [1, 3, 8, 64])
@pytest.mark.parametrize("prefix", [[], [5, 17, 2, 40, 9]])
def test_equals_ar_on_each_prompt(slots, prefix):
    """fp32: token for token, whatever the rows beside a sequence are doing (prefill or decode),
    with stops that end sequences at different lengths so rows are refilled mid-flight, and with
    a common prefix (computed once, copied into each row) or none."""
    model, ps = tiny_target(), [prefix + p for p in prompts(11)]
    assert shared_prefix(ps) == len(prefix)
    stops = {46, 13, 38}  # end 6 of the 11 answers after 1-9 tokens, the rest run to 20
    want = [generate(model, p, max_new_tokens=20, stop_ids=stops).tokens[0] for p in ps]
    assert len({len(w) for w in want}) > 2  # the lengths differ: refills happen
    if not prefix:
        assert [len(w) for w in want] == [20, 9, 5, 1, 20, 4, 1, 20, 8, 20, 20]
    done = {}
    got = generate_continuous(model, ps, 20, stop_ids=stops, slots=slots, on_done=done.__setitem__)
    assert got == want
    assert generate_continuous(model, ps, 20, stop_ids=stops, slots=slots, share_prefix=False) == want
    assert done == dict(enumerate(want))


def test_no_stops_and_edge_cases():
    model, ps = tiny_target(seed=1), prompts(5, seed=1)
    assert generate_continuous(model, ps, 9, slots=2) == generate(model, ps, max_new_tokens=9).tokens
    assert generate_continuous(model, [], 9) == []
    with pytest.raises(ValueError, match="slots=0"):
        generate_continuous(model, ps, 9, slots=0)
    with pytest.raises(ValueError, match=r"prompts\[1\]: empty"):
        generate_continuous(model, [[1], []], 9)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        generate_continuous(model, ps, 0)
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        generate_continuous(model, [[1] * 1000], 30)


def test_shared_prefix_leaves_each_prompt_a_token_and_the_cache_checks_rows():
    assert shared_prefix([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert shared_prefix([[7], [7, 8]]) == 0 and shared_prefix([[4, 5]]) == 1
    cache = tiny_target().new_cache(rows=2, max_len=8)
    cache.lengths[0] = 3
    with pytest.raises(ValueError, match="share_prefix.*length in \\[0, 3\\]"):
        cache.share_prefix(0, 1, 4)
    with pytest.raises(ValueError, match="needs two rows"):
        cache.share_prefix(0, 0, 2)


def test_a_newcomer_rides_in_the_running_rows_pass():
    """ArDecoder, the admit path of generate, the server and continuous batching: a sequence admitted
    between steps has its prompt read in the next step's pass, beside the others' tokens (no pass of
    its own), and answers as it would alone; a decoder with a shared prefix takes only prompts that
    start with it and go on past it."""
    from d3d.decode.engines import ArDecoder
    from d3d.decode.sequence import Sequence

    model, ps = tiny_target(seed=2), prompts(3, seed=2)
    want = [generate(model, p, max_new_tokens=6, stop_ids=[]).tokens[0] for p in ps]
    dec = ArDecoder(model, rows=3, max_len=40)
    seqs = [Sequence(p, 6, id=i) for i, p in enumerate(ps)]
    dec.admit(seqs[:2])
    assert dec.room() == 1
    dec.step()
    dec.admit(seqs[2:])
    while dec.step():
        pass
    assert [s.output for s in seqs] == want
    assert dec.stats.target_forwards == 7  # the first step's prefill, 5 more tokens, 1 for the newcomer's last
    shared = ArDecoder(model, rows=2, max_len=40, prefix=[5, 17])
    with pytest.raises(ValueError, match="sequence 0's prompt must start with the decoder's 2-token prefix"):
        shared.admit([Sequence([5, 17], 4)])
    with pytest.raises(ValueError, match="sequence 1's prompt"):
        shared.admit([Sequence([5, 18, 3], 4, id=1)])
