"""Two-stream mixing and packing into ``sequence_length + 1`` windows, with a checkpointable cursor.

The paper's loader (experiments spec section 3): document ``n`` of the mixed sequence comes from stream A iff

    ceil((n + 1) * 41 / 50) > ceil(n * 41 / 50)

so every block of 50 consecutive documents (n = 50k .. 50k + 49) holds exactly 41 from A and 9 from B, always in
the same interleaving (:func:`mix_schedule`): B takes positions 5, 11, 16, 22, 27, 33, 38, 44 and 49 of each block.
Each document is ``[BOS] + tokens + [EOS]`` (:mod:`ue5m3.data.shards`) and is appended to one persistent buffer;
the buffer is cut into non-overlapping windows of ``sequence_length + 1`` tokens, ``inputs = w[:-1]`` and
``targets = w[1:]``. ``MixUnit.WINDOW`` applies the same schedule to windows instead (window ``n`` comes from A or
B, each stream packing its own buffer), so every 50 consecutive windows hold exactly 41 from A.

Each stream is read in a fresh order per epoch (a permutation seeded by ``(seed, stream, epoch)`` when shuffling,
else source order) and wraps around deterministically. The cursor (:meth:`PackedStream.state_dict`) is plain
Python ints, lists and strings, torch.save-safe: per stream its epoch and position, the mix position, the
buffered document pieces and the windows emitted, plus the settings it belongs to. Loading it reproduces every
later batch exactly.

Data parallelism: a global batch is ``batch_size * world_size`` consecutive windows; rank ``r`` gets windows
``[r * batch_size, (r + 1) * batch_size)`` of it. All ranks advance the same cursor, so the global batches do not
depend on the world size and a run may resume on a different number of ranks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ue5m3.data.config import MixUnit
from ue5m3.data.shards import TokenShards

__all__ = ["mix_schedule", "DataExhausted", "PackedStream", "EvalSet", "build_eval_set", "check_disjoint"]

_STATE_FORMAT = 1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def mix_schedule(n: int, mix: tuple[int, int] = (41, 50)) -> int:
    """Stream (0 = A, 1 = B) of mix unit ``n``: A iff ``ceil((n + 1) a / p) > ceil(n a / p)`` (exact integers)."""
    a, period = mix
    return 0 if _ceil_div((n + 1) * a, period) > _ceil_div(n * a, period) else 1


class DataExhausted(Exception):
    """A stream ran out of documents in a loader that may not wrap around (the evaluation sets)."""


class PackedStream:
    """Mixes two tokenized streams and packs them into windows; see the module docstring.

    Args:
        streams: stream A and stream B.
        sequence_length: input tokens per window (a window holds one more).
        mix: (a, period) of the schedule.
        mix_unit: mix documents (the paper) or windows.
        seed: seed of the per-epoch shuffles.
        shuffle: shuffle each stream per epoch; False keeps source order.
        rank, world_size: this process's slice of every global batch.
        wrap: start a new epoch when a stream is exhausted; False raises :class:`DataExhausted` instead.
    """

    def __init__(
        self,
        streams: Sequence[TokenShards],
        *,
        sequence_length: int,
        mix: tuple[int, int] = (41, 50),
        mix_unit: MixUnit = MixUnit.DOCUMENT,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        wrap: bool = True,
    ) -> None:
        if len(streams) != 2:
            raise ValueError(f"expected two streams (A, B), got {len(streams)}")
        for name, stream in zip("AB", streams, strict=True):
            if len(stream) == 0:
                raise ValueError(f"stream {name} ({str(stream.root)!r}) holds no documents")
        if sequence_length < 1:
            raise ValueError(f"sequence_length must be >= 1, got {sequence_length!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank {rank!r}, world_size {world_size!r}")
        self.streams = tuple(streams)
        self.sequence_length = sequence_length
        self.mix = (int(mix[0]), int(mix[1]))
        self.mix_unit = MixUnit(mix_unit)
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.wrap = wrap
        self._orders: list[tuple[int, np.ndarray] | None] = [None, None]
        self._settings = {
            "sequence_length": sequence_length,
            "mix": list(self.mix),
            "mix_unit": self.mix_unit.value,
            "seed": seed,
            "shuffle": shuffle,
            "streams": [s.fingerprint for s in self.streams],
        }
        self._epochs = [0, 0]
        self._positions = [0, 0]
        self._mix_position = 0
        self._windows_emitted = 0
        # Buffered document pieces [stream, document, start, end): one buffer, or one per stream in window mode.
        self._buffers: list[list[list[int]]] = [[] for _ in range(1 if self.mix_unit is MixUnit.DOCUMENT else 2)]

    # ----- cursor -------------------------------------------------------------------------------------------

    @property
    def windows_emitted(self) -> int:
        """Windows drawn so far over all ranks (global batches x global batch size)."""
        return self._windows_emitted

    def state_dict(self) -> dict[str, Any]:
        """The cursor as plain ints, lists and strings (safe for ``torch.load(weights_only=True)``)."""
        return {
            "format": _STATE_FORMAT,
            "settings": json.loads(json.dumps(self._settings)),
            "epochs": list(self._epochs),
            "positions": list(self._positions),
            "mix_position": self._mix_position,
            "windows_emitted": self._windows_emitted,
            "buffers": [[list(piece) for piece in buffer] for buffer in self._buffers],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a cursor written by :meth:`state_dict` of a loader with the same data and settings.

        Raises:
            ValueError: the cursor belongs to other data or other settings (the differing keys are named).
        """
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"unknown loader state format {state.get('format')!r}; expected {_STATE_FORMAT}")
        theirs = state["settings"]
        differ = {k: (theirs.get(k), v) for k, v in self._settings.items() if theirs.get(k) != v}
        if differ:
            raise ValueError(
                f"the loader state was written for other data or settings: {differ} (saved, current); "
                "resume with the configuration and token shards of the checkpointed run"
            )
        self._epochs = [int(e) for e in state["epochs"]]
        self._positions = [int(p) for p in state["positions"]]
        self._mix_position = int(state["mix_position"])
        self._windows_emitted = int(state["windows_emitted"])
        self._buffers = [[[int(x) for x in piece] for piece in buffer] for buffer in state["buffers"]]

    # ----- drawing ------------------------------------------------------------------------------------------

    def _order(self, stream: int, epoch: int) -> np.ndarray:
        cached = self._orders[stream]
        if cached is None or cached[0] != epoch:
            n = len(self.streams[stream])
            if self.shuffle:
                rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, stream, epoch])))
                order = rng.permutation(n)
            else:
                order = np.arange(n)
            cached = (epoch, order)
            self._orders[stream] = cached
        return cached[1]

    def _draw(self, stream: int) -> list[int]:
        """The next document of ``stream`` as a buffer piece, advancing that stream's cursor."""
        n = len(self.streams[stream])
        if self._positions[stream] == n:
            if not self.wrap:
                raise DataExhausted(f"stream {'AB'[stream]} ({str(self.streams[stream].root)!r}) is exhausted")
            self._epochs[stream] += 1
            self._positions[stream] = 0
        doc = int(self._order(stream, self._epochs[stream])[self._positions[stream]])
        self._positions[stream] += 1
        return [stream, doc, 0, self.streams[stream].length(doc)]

    def _next_window(self) -> list[tuple[int, int, int, int]]:
        """Pieces of the next window in token order; advances the cursor by one window."""
        need = self.sequence_length + 1
        if self.mix_unit is MixUnit.WINDOW:
            fixed: int | None = mix_schedule(self._mix_position, self.mix)
            self._mix_position += 1
            buffer = self._buffers[fixed]
        else:
            fixed = None
            buffer = self._buffers[0]
        have = sum(end - start for _, _, start, end in buffer)
        while have < need:
            if fixed is None:
                stream = mix_schedule(self._mix_position, self.mix)
                piece = self._draw(stream)
                self._mix_position += 1
            else:
                piece = self._draw(fixed)
            buffer.append(piece)
            have += piece[3]
        window = []
        while need:
            stream, doc, start, end = buffer[0]
            take = min(need, end - start)
            window.append((stream, doc, start, start + take))
            if start + take == end:
                buffer.pop(0)
            else:
                buffer[0] = [stream, doc, start + take, end]
            need -= take
        self._windows_emitted += 1
        return window

    def _materialize(self, window: Sequence[tuple[int, int, int, int]]) -> np.ndarray:
        parts = [self.streams[s].tokens(d, a, b) for s, d, a, b in window]
        return np.concatenate(parts).astype(np.int64)

    def next_windows(self, count: int) -> tuple[torch.Tensor, list[list[tuple[int, int, int, int]]]]:
        """This rank's share of the next ``count * world_size`` windows: int64 [count, L + 1] and their pieces."""
        if count < 1:
            raise ValueError(f"batch size must be >= 1, got {count!r}")
        pieces = [self._next_window() for _ in range(count * self.world_size)]
        mine = pieces[self.rank * count : (self.rank + 1) * count]
        tokens = np.stack([self._materialize(w) for w in mine])  # [count, L + 1]
        return torch.from_numpy(tokens), mine

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch of this rank: ``inputs`` and ``targets``, int64 [batch_size, sequence_length] each."""
        windows, _ = self.next_windows(batch_size)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # targets = inputs shifted by one

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of one window forever (or until a non-wrapping loader is exhausted)."""
        while True:
            try:
                yield self.next_batch(1)
            except DataExhausted:
                return


# ----- evaluation sets ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalSet:
    """A fixed set of windows evaluated one sequence at a time (batch size 1, no padding)."""

    name: str
    """``validation`` or ``calibration``."""
    windows: torch.Tensor
    """int64 [count, sequence_length + 1] in fixed order."""
    document_ids: tuple[str, ...]
    """Ids of the documents the windows draw tokens from, in order of first use."""

    def __len__(self) -> int:
        return int(self.windows.shape[0])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(inputs, targets), int64 [1, sequence_length] each, window by window."""
        for window in self.windows:
            yield window[None, :-1], window[None, 1:]

    def sha256(self) -> str:
        """SHA-256 of the windows' little-endian int64 bytes: identifies the set in results."""
        return hashlib.sha256(self.windows.numpy().astype("<i8").tobytes()).hexdigest()


def build_eval_set(
    streams: Sequence[TokenShards],
    *,
    name: str,
    sequence_length: int,
    count: int,
    mix: tuple[int, int] = (41, 50),
    mix_unit: MixUnit = MixUnit.DOCUMENT,
) -> EvalSet:
    """The first ``count`` windows of a held-out split, mixed and packed like training, in source order.

    Raises:
        ValueError: the split holds fewer full windows (the message says how many and what to change).
    """
    rows: list[torch.Tensor] = []
    used: dict[tuple[int, int], str] = {}
    if count == 0:
        return EvalSet(name=name, windows=torch.empty(0, sequence_length + 1, dtype=torch.int64), document_ids=())
    loader = PackedStream(
        streams, sequence_length=sequence_length, mix=mix, mix_unit=mix_unit, shuffle=False, wrap=False
    )
    for i in range(count):
        try:
            tokens, (pieces,) = loader.next_windows(1)
        except DataExhausted as exc:
            raise ValueError(
                f"the {name} split holds only {i} windows of {sequence_length + 1} tokens, {count} requested ({exc}); "
                f"lower data.{name}_windows or raise data.{name}_fraction"
            ) from None
        rows.append(tokens[0])
        for s, d, _, _ in pieces:
            used.setdefault((s, d), streams[s].ids[d])
    return EvalSet(name=name, windows=torch.stack(rows), document_ids=tuple(used.values()))


def check_disjoint(splits: Mapping[str, Sequence[str]]) -> None:
    """Refuse document ids shared by two splits.

    Args:
        splits: split name -> document ids (e.g. train, validation, calibration).

    Raises:
        ValueError: naming both splits and (up to ten of) the shared ids.
    """
    names = list(splits)
    sets = {name: set(ids) for name, ids in splits.items()}
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            shared = sorted(sets[first] & sets[second])
            if shared:
                raise ValueError(
                    f"the {first} and {second} splits share {len(shared)} document(s): {shared[:10]}; "
                    "held-out sets must be disjoint: rebuild the splits with prepare_corpus"
                )
