"""Tests of ue5m3.data.loader: the 41-of-50 mixing schedule, packing, epochs, the checkpointable cursor, rank
sharding and evaluation sets (byte tokenizer test double, so every expected token is known)."""

from __future__ import annotations

import io

import pytest
import torch

from ue5m3.data import DataExhausted, MixUnit, PackedStream, build_eval_set, check_disjoint, mix_schedule

# ----- mixing schedule -------------------------------------------------------------------------------------------


def test_mix_schedule_takes_exactly_41_of_every_50_in_a_fixed_interleaving():
    streams = [mix_schedule(n) for n in range(50 * 40)]
    blocks = [streams[i : i + 50] for i in range(0, len(streams), 50)]
    assert all(block.count(0) == 41 for block in blocks)
    assert all(block == blocks[0] for block in blocks)
    assert [n for n, s in enumerate(blocks[0]) if s == 1] == [5, 11, 16, 22, 27, 33, 38, 44, 49]


# ----- packing and mixing ----------------------------------------------------------------------------------------


def test_windows_have_sequence_plus_one_tokens_and_targets_shift_inputs(byte_streams):
    loader = PackedStream(byte_streams, sequence_length=16, seed=3)
    inputs, targets = loader.next_batch(4)
    assert inputs.shape == targets.shape == (4, 16)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def test_packing_concatenates_mixed_documents_into_non_overlapping_windows(byte_streams):
    a, b = byte_streams
    loader = PackedStream(byte_streams, sequence_length=16, shuffle=False)
    windows, _ = loader.next_windows(40)
    # The expected token stream: document n from stream mix_schedule(n), each stream in source order.
    expected, cursor = [], [0, 0]
    while len(expected) < windows.numel():
        s = mix_schedule(sum(cursor))
        stream = (a, b)[s]
        expected.extend(stream.tokens(cursor[s] % len(stream)).tolist())
        cursor[s] += 1
    assert windows.flatten().tolist() == expected[: windows.numel()]


def test_document_mix_draws_41_of_every_50_documents_from_stream_a(byte_streams):
    loader = PackedStream(byte_streams, sequence_length=16, seed=5)
    _, windows = loader.next_windows(400)
    starts = [s for window in windows for s, _, start, _ in window if start == 0]  # draw order
    assert len(starts) >= 200
    for i in range(0, len(starts) - 49, 50):
        assert starts[i : i + 50].count(0) == 41


def test_window_mix_draws_41_of_every_50_windows_from_stream_a(byte_streams):
    loader = PackedStream(byte_streams, sequence_length=16, mix_unit=MixUnit.WINDOW, seed=5)
    _, windows = loader.next_windows(500)
    sources = []
    for n, window in enumerate(windows):
        streams = {s for s, _, _, _ in window}
        assert streams == {mix_schedule(n)}
        sources.append(streams.pop())
    for i in range(0, 500, 50):
        assert sources[i : i + 50].count(0) == 41


def test_epochs_wrap_with_a_fresh_seeded_order(byte_streams):
    _, b = byte_streams
    loader = PackedStream(byte_streams, sequence_length=16, seed=9)
    tokens, windows = loader.next_windows(300)
    order_b = [d for window in windows for s, d, start, _ in window if s == 1 and start == 0]
    epochs = [order_b[i : i + len(b)] for i in range(0, len(order_b) - len(b) + 1, len(b))]
    assert len(epochs) >= 3
    assert all(sorted(e) == list(range(len(b))) for e in epochs)  # each epoch visits every document once
    assert epochs[0] != epochs[1]
    assert torch.equal(PackedStream(byte_streams, sequence_length=16, seed=9).next_windows(300)[0], tokens)
    assert not torch.equal(PackedStream(byte_streams, sequence_length=16, seed=10).next_windows(300)[0], tokens)


@pytest.mark.parametrize("mix_unit", list(MixUnit))
@pytest.mark.parametrize("shuffle", [True, False])
def test_resuming_from_the_cursor_reproduces_the_next_batches(byte_streams, mix_unit, shuffle):
    settings = dict(sequence_length=16, mix_unit=mix_unit, seed=11, shuffle=shuffle)
    reference = PackedStream(byte_streams, **settings)
    for _ in range(23):  # far enough that both streams have wrapped
        reference.next_batch(3)
    buffer = io.BytesIO()
    torch.save(reference.state_dict(), buffer)
    expected = [reference.next_batch(3) for _ in range(10)]
    resumed = PackedStream(byte_streams, **settings)
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for inputs, targets in expected:
        got_inputs, got_targets = resumed.next_batch(3)
        assert torch.equal(got_inputs, inputs) and torch.equal(got_targets, targets)
    assert resumed.windows_emitted == reference.windows_emitted == 99


def test_loading_a_cursor_of_other_settings_is_refused(byte_streams):
    state = PackedStream(byte_streams, sequence_length=16, seed=1).state_dict()
    other = PackedStream(byte_streams, sequence_length=32, seed=1)
    with pytest.raises(ValueError, match=r"sequence_length.*\(16, 32\)"):
        other.load_state_dict(state)


def test_ranks_get_disjoint_slices_that_cover_the_global_batch(byte_streams):
    single = PackedStream(byte_streams, sequence_length=16, seed=4)
    ranks = [PackedStream(byte_streams, sequence_length=16, seed=4, rank=r, world_size=3) for r in range(3)]
    for _ in range(5):
        global_windows, global_pieces = single.next_windows(6)
        shares = [rank.next_windows(2) for rank in ranks]
        assert torch.equal(torch.cat([w for w, _ in shares]), global_windows)
        pieces = [piece for _, p in shares for window in p for piece in window]
        assert len(pieces) == len(set(pieces)) == sum(len(w) for w in global_pieces)
    assert all(r.state_dict() == single.state_dict() for r in ranks)


# ----- evaluation sets -------------------------------------------------------------------------------------------


def test_eval_set_is_the_first_windows_in_source_order_at_batch_size_one(byte_streams):
    eval_set = build_eval_set(byte_streams, name="validation", sequence_length=16, count=5)
    loader = PackedStream(byte_streams, sequence_length=16, shuffle=False)
    assert torch.equal(eval_set.windows, loader.next_windows(5)[0])
    pairs = list(eval_set)
    assert len(pairs) == 5 and all(x.shape == y.shape == (1, 16) for x, y in pairs)
    assert eval_set.document_ids[:2] == ("A000", "A001")
    assert eval_set.sha256() == build_eval_set(byte_streams, name="v", sequence_length=16, count=5).sha256()


def test_eval_set_larger_than_its_split_is_refused(byte_streams):
    with pytest.raises(ValueError, match=r"the calibration split holds only \d+ windows of 17 tokens, 999 requested"):
        build_eval_set(byte_streams, name="calibration", sequence_length=16, count=999)
    loader = PackedStream(byte_streams, sequence_length=16, shuffle=False, wrap=False)
    with pytest.raises(DataExhausted):
        loader.next_windows(999)


def test_check_disjoint_names_the_shared_documents():
    check_disjoint({"validation": ["a", "b"], "calibration": ["c"]})
    with pytest.raises(ValueError, match=r"the validation and calibration splits share 2 document\(s\): \['b', 'c'\]"):
        check_disjoint({"train": ["x"], "validation": ["a", "b", "c"], "calibration": ["c", "b"]})
