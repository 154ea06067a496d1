"""Counter-based random bits for stochastic rounding: Philox4x32-10, keyed by what is being rounded.

Every stochastic rounding draws its bits from Philox4x32-10 (Salmon et al., SC'11; the generator of cuRAND and
Triton's ``tl.randint``), so the bits of one element depend only on *which* element of *which* quantization it
is, never on the device, the thread count, the order of work or how the tensor is sharded:

* key (two 32-bit words) = a 64-bit hash of (run seed, module name, operand role): one stream per quantizer
  call site of a run;
* counter (four 32-bit words) = (element group, element group >> 32, optimizer step, microbatch), where the
  element group is the element's *global* row-major index in the logical (unsharded) tensor divided by the number
  of elements one Philox block serves.

One Philox call yields 128 bits. Modes with 8 random bits (``sf``, ``sr_te``) give each element one 32-bit word
(element i uses word ``i % 4`` of counter ``i // 4``) and keep its top 8 bits; ``sr`` (53 bits) gives each
element two words (words ``2 (i % 2)`` and ``2 (i % 2) + 1`` of counter ``i // 2``: all 32 bits of the first
above the top 21 of the second, see :func:`bits_from_words`).
The C kernel (``kernels/csrc/philox.h``) and the GPU kernels compute exactly these bits in place;
:func:`random_bits` here is the reference and materialises them (tests, the torch path).

Resuming a run needs nothing beyond the step counter a checkpoint already holds: the bits of step s are a pure
function of (seed, module, role, s, microbatch, index).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = [
    "PHILOX_M0",
    "PHILOX_M1",
    "PHILOX_W0",
    "PHILOX_W1",
    "philox4x32",
    "philox4x32_int",
    "RandomStream",
    "ElementIndex",
    "elements_per_counter",
    "random_bits",
    "stream_key",
    "bits_from_words",
    "SRState",
]

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9  # Weyl increments of the key (golden ratio, sqrt(3) - 1)
PHILOX_W1 = 0xBB67AE85
ROUNDS = 10
_MASK32 = 0xFFFFFFFF


# ----- Philox4x32-10 ------------------------------------------------------------------------------------


def philox4x32_int(counter: tuple[int, int, int, int], key: tuple[int, int], rounds: int = ROUNDS) -> tuple[int, ...]:
    """Philox4x32 on Python integers (the scalar reference the tensor version is tested against)."""
    c0, c1, c2, c3 = (int(w) & _MASK32 for w in counter)
    k0, k1 = (int(w) & _MASK32 for w in key)
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & _MASK32, (k1 + PHILOX_W1) & _MASK32
        p0, p1 = PHILOX_M0 * c0, PHILOX_M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0), p1 & _MASK32, ((p0 >> 32) ^ c3 ^ k1), p0 & _MASK32
    return c0, c1, c2, c3


def _mulhilo(multiplier: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of multiplier * x for x in [0, 2^32) held in int64, without int64 overflow: the
    multiplier is split into 16-bit halves so every partial product stays below 2^49."""
    m_hi, m_lo = multiplier >> 16, multiplier & 0xFFFF
    low_part = x * m_lo  # < 2^48
    high_part = x * m_hi  # < 2^48; the product is high_part * 2^16 + low_part
    hi = (high_part + (low_part >> 16)) >> 16
    lo = (((high_part & 0xFFFF) << 16) + low_part) & _MASK32
    return hi, lo


def philox4x32(
    counter: tuple[torch.Tensor | int, ...], key: tuple[int, int], rounds: int = ROUNDS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32 on int64 tensors holding 32-bit words (broadcast together); returns the four output words."""
    device = next((w.device for w in counter if isinstance(w, torch.Tensor)), None)
    words = torch.broadcast_tensors(*(torch.as_tensor(w, dtype=torch.int64, device=device) for w in counter))
    c0, c1, c2, c3 = (w & _MASK32 for w in words)
    k0, k1 = (int(w) & _MASK32 for w in key)
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & _MASK32, (k1 + PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


# ----- streams and element indices ----------------------------------------------------------------------


@lru_cache(maxsize=4096)
def stream_key(seed: int, module: str, role: str) -> tuple[int, int]:
    """The Philox key of one (seed, module, role): the first 8 bytes of BLAKE2b over their canonical text."""
    digest = hashlib.blake2b(f"ue5m3-sr\0{seed}\0{module}\0{role}".encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return value & _MASK32, value >> 32


@dataclass(frozen=True)
class RandomStream:
    """Which quantization the bits belong to: (seed, module, role) pick the key, (step, microbatch) the counter.

    Attributes:
        seed: the run seed (any non-negative int).
        module: the module's name (e.g. ``layers.3.mlp.down_proj``); "" outside models.
        role: the operand role at the call site (e.g. ``dgrad_upstream_gradient``).
        step: optimizer step (32 bits).
        microbatch: microbatch index inside the step (32 bits).
    """

    seed: int
    module: str = ""
    role: str = ""
    step: int = 0
    microbatch: int = 0

    def __post_init__(self) -> None:
        for field in ("seed", "step", "microbatch"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"RandomStream.{field} must be a non-negative int, got {value!r}")
        for field in ("step", "microbatch"):
            if getattr(self, field) > _MASK32:
                raise ValueError(f"RandomStream.{field} must fit 32 bits, got {getattr(self, field)!r}")

    @property
    def key(self) -> tuple[int, int]:
        return stream_key(self.seed, self.module, self.role)


@dataclass(frozen=True)
class ElementIndex:
    """Where a (local) tensor sits inside the logical tensor whose row-major indices key the random bits.

    Attributes:
        global_shape: shape of the logical, unsharded tensor (None: the local tensor is the whole tensor).
        offset: per-dimension start of the local tensor inside it (None: all zeros).
    """

    global_shape: tuple[int, ...] | None = None
    offset: tuple[int, ...] | None = None

    def resolve(self, shape: tuple[int, ...], name: str = "x") -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(global shape, offset), checked against the local ``shape``."""
        shape = tuple(shape)
        global_shape = tuple(self.global_shape) if self.global_shape is not None else shape
        offset = tuple(self.offset) if self.offset is not None else (0,) * len(shape)
        if len(global_shape) != len(shape) or len(offset) != len(shape):
            raise ValueError(
                f"element index of {name!r}: global_shape {global_shape} and offset {offset} need "
                f"{len(shape)} dimensions like the tensor {shape}"
            )
        for d, (o, n, g) in enumerate(zip(offset, shape, global_shape, strict=True)):
            if o < 0 or o + n > g:
                raise ValueError(
                    f"element index of {name!r}: dimension {d} spans [{o}, {o + n}) outside the global size {g}"
                )
        return global_shape, offset

    def strides(self, shape: tuple[int, ...], name: str = "x") -> tuple[int, tuple[int, ...]]:
        """(base, per-dimension strides): global index = base + sum(i_d * stride_d) for local indices i_d."""
        global_shape, offset = self.resolve(shape, name)
        strides, running = [], 1
        for g in reversed(global_shape):
            strides.append(running)
            running *= g
        strides.reverse()
        base = sum(o * s for o, s in zip(offset, strides, strict=True))
        return base, tuple(strides)

    def indices(
        self, shape: tuple[int, ...], name: str = "x", device: torch.device | str | None = None
    ) -> torch.Tensor:
        """Global row-major index of every local element (int64, shaped like the tensor, on ``device``)."""
        base, strides = self.strides(shape, name)
        index = torch.full(tuple(shape), base, dtype=torch.int64, device=device)
        for d, (n, s) in enumerate(zip(shape, strides, strict=True)):
            view = [1] * len(shape)
            view[d] = n
            index = index + torch.arange(n, dtype=torch.int64, device=device).reshape(view) * s
        return index


def elements_per_counter(bit_count: int) -> int:
    """How many elements one Philox call (128 bits) serves: 4 for up to 32 bits per element, 2 for up to 64."""
    if not 0 < bit_count <= 64:
        raise ValueError(f"random bit count must be in 1..64, got {bit_count}")
    return 4 if bit_count <= 32 else 2


def bits_from_words(words: tuple[torch.Tensor, ...], lane: torch.Tensor, bit_count: int) -> torch.Tensor:
    """An element's ``bit_count`` random bits from the Philox output ``words`` and its lane in the block.

    Up to 32 bits: the top ``bit_count`` bits of word ``lane``. Up to 64 bits: word ``2 lane`` supplies the high
    32 and word ``2 lane + 1`` the rest (its top bits), concatenated as one integer.
    """
    if bit_count <= 32:
        word = torch.where(
            lane == 0, words[0], torch.where(lane == 1, words[1], torch.where(lane == 2, words[2], words[3]))
        )
        return word >> (32 - bit_count)
    high = torch.where(lane == 0, words[0], words[2])
    low = torch.where(lane == 0, words[1], words[3])
    return (high << (bit_count - 32)) | (low >> (64 - bit_count))


def random_bits(
    stream: RandomStream,
    shape: tuple[int, ...] | torch.Size,
    bit_count: int,
    *,
    index: ElementIndex | None = None,
    name: str = "x",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The random integers in [0, 2^bit_count) a stochastic rounding of a tensor of ``shape`` consumes (int64, on
    ``device``: computed there, no host round trip).

    Element bits depend only on ``stream`` and the element's global index (see :class:`ElementIndex`), so two
    shardings of one tensor draw the same bits element for element.
    """
    per = elements_per_counter(bit_count)
    global_index = (index or ElementIndex()).indices(tuple(shape), name, device)
    group = global_index // per
    words = philox4x32((group & _MASK32, group >> 32, stream.step, stream.microbatch), stream.key)
    return bits_from_words(words, global_index % per, bit_count)


class SRState:
    """The stochastic-rounding counters of a training run, shared by a model's FP4 linears.

    Holds the run seed and this process's data-parallel shard (rank ``rank`` of ``world`` holds the rank-th
    contiguous slice of every global microbatch, as :class:`ue5m3.data.loader.BatchStream` deals them), and the
    step and microbatch the trainer opens. :meth:`stream` names the bits of one quantizer call site and
    :meth:`token_index` places a local operand in the global microbatch, so the bits are those of a single-process
    run of the same global batch. Nothing here needs checkpointing beyond the step a checkpoint already holds.
    """

    def __init__(self, seed: int, *, rank: int = 0, world: int = 1) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"SRState seed must be a non-negative int, got {seed!r}")
        if not 0 <= rank < world:
            raise ValueError(f"SRState needs 0 <= rank < world, got rank {rank!r}, world {world!r}")
        self.seed, self.rank, self.world = seed, rank, world
        self.step, self.microbatch = 0, 0

    def begin_step(self, step: int) -> None:
        """Open optimizer step ``step`` (its first microbatch is 0)."""
        self.step, self.microbatch = step, 0

    def begin_microbatch(self, index: int) -> None:
        self.microbatch = index

    def stream(self, module: str, role: str) -> RandomStream:
        return RandomStream(seed=self.seed, module=module, role=role, step=self.step, microbatch=self.microbatch)

    def token_index(self, shape: tuple[int, ...], token_axis: int) -> ElementIndex | None:
        """Where a local operand with tokens along ``token_axis`` sits in the global microbatch (None: world 1)."""
        if self.world == 1:
            return None
        global_shape, offset = list(shape), [0] * len(shape)
        global_shape[token_axis] = shape[token_axis] * self.world
        offset[token_axis] = shape[token_axis] * self.rank
        return ElementIndex(tuple(global_shape), tuple(offset))

    def __repr__(self) -> str:
        return (
            f"SRState(seed={self.seed}, rank={self.rank}, world={self.world}, step={self.step}, "
            f"microbatch={self.microbatch})"
        )
