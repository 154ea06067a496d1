"""Tokenizers: a small byte-level BPE trained at CPU scale, or any ``tokenizer.json`` (Nemotron's on the cluster).

The paper tokenizes with the Nemotron tokenizer (vocabulary 131,072; PAD 0, BOS 1, EOS 2), which only the hub
serves. Offline, :func:`train_tokenizer` trains a byte-level BPE with the Hugging Face ``tokenizers`` library on
the training split, with the same special-token ids: ``<pad>`` = 0, ``<s>`` = 1 (BOS), ``</s>`` = 2 (EOS). It has
no normalizer and a byte-level pre-tokenizer and decoder, so ``decode(encode(text)) == text`` for every string.
Encoding never adds or matches special tokens (a literal ``<s>`` in a document stays text, for any loaded
tokenizer): BOS and EOS are written around each document by :func:`ue5m3.data.shards.tokenize_to_shards` alone.
Training is deterministic for a given input order and vocabulary.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ue5m3.artifacts import atomic_path

__all__ = ["PAD_ID", "BOS_ID", "EOS_ID", "SPECIAL_TOKENS", "TextTokenizer", "train_tokenizer", "load_tokenizer"]

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
"""Special tokens of the trained BPE in id order (as Nemotron: PAD 0, BOS 1, EOS 2)."""

_INSTALL_HINT = "install it with `pip install tokenizers`"


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as exc:
        raise ImportError(f"the tokenizer needs the Hugging Face tokenizers library; {_INSTALL_HINT}") from exc
    return tokenizers


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` with its BOS and EOS ids resolved; encodes without adding special tokens."""

    def __init__(self, tokenizer: Any, *, path: Path, bos_token: str = "<s>", eos_token: str = "</s>") -> None:
        # Literal "<s>" or "</s>" inside a document (code, markup) must stay text: only the shard writer inserts
        # BOS and EOS. Without this the library would match special tokens in the raw text.
        tokenizer.encode_special_tokens = True
        self.tokenizer = tokenizer
        self.path = path
        ids = {}
        for role, token in (("bos_token", bos_token), ("eos_token", eos_token)):
            token_id = tokenizer.token_to_id(token)
            if token_id is None:
                raise ValueError(
                    f"{role} {token!r} is not in the vocabulary of {str(path)!r}; set data.{role} to the file's "
                    "beginning/end-of-document token"
                )
            ids[role] = token_id
        self.bos_id: int = ids["bos_token"]
        self.eos_id: int = ids["eos_token"]

    @property
    def vocab_size(self) -> int:
        """Number of token ids, special tokens included."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of several texts (encoded in parallel by the library), no BOS/EOS."""
        return [list(e.ids) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids, special tokens dropped."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


def train_tokenizer(
    train_texts: Iterable[str],
    vocab_size: int,
    out_path: str | os.PathLike[str],
    *,
    min_frequency: int = 2,
) -> TextTokenizer:
    """Train a byte-level BPE on ``train_texts`` and save it as a ``tokenizer.json`` (atomically).

    Args:
        train_texts: training documents (the training split only, never validation or calibration).
        vocab_size: total vocabulary including the 256 byte symbols and the three special tokens.
        out_path: destination file.
        min_frequency: a pair must occur this often to be merged.

    Returns:
        The trained tokenizer, loaded back from ``out_path``.

    Raises:
        ValueError: ``vocab_size`` leaves no room for a merge.
        ImportError: the ``tokenizers`` library is missing.
    """
    tk = _tokenizers()
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 260:
        raise ValueError(f"vocab_size must be an int >= 260 (256 bytes + 3 special + 1 merge), got {vocab_size!r}")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    # add_prefix_space=False and no normalizer keep decode(encode(text)) == text exactly.
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = tk.decoders.ByteLevel()
    tokenizer.encode_special_tokens = True  # count literal "<s>" in the texts as text while training, too
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),  # ids 0, 1, 2 in this order
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(train_texts, trainer=trainer)
    out = Path(out_path)
    with atomic_path(out) as tmp:
        tokenizer.save(str(tmp), pretty=False)
    loaded = load_tokenizer(out)
    assert (loaded.tokenizer.token_to_id("<pad>"), loaded.bos_id, loaded.eos_id) == (PAD_ID, BOS_ID, EOS_ID)
    return loaded


def load_tokenizer(
    path: str | os.PathLike[str], *, bos_token: str = "<s>", eos_token: str = "</s>", vocab_size: int | None = None
) -> TextTokenizer:
    """Load any ``tokenizer.json`` (the trained BPE, or the Nemotron tokenizer file on the cluster).

    Args:
        path: the tokenizer file.
        bos_token, eos_token: the beginning/end-of-document tokens (``<s>`` and ``</s>`` in both tokenizers).
        vocab_size: if given, the file's vocabulary size must equal it (the model's embedding size).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a special token is missing or the vocabulary size differs.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {str(path)!r} does not exist")
    tokenizer = TextTokenizer(
        _tokenizers().Tokenizer.from_file(str(path)), path=path, bos_token=bos_token, eos_token=eos_token
    )
    if vocab_size is not None and tokenizer.vocab_size != vocab_size:
        raise ValueError(
            f"{str(path)!r} has {tokenizer.vocab_size} tokens but data.vocab_size is {vocab_size!r}; make them agree"
        )
    return tokenizer
