"""The project's one lm-eval model: ``--model ue5m3`` (style rule 12), a :class:`~lm_eval.api.model.TemplateLM`.

:class:`UE5M3LM` wraps any object with ``forward_unit(input_ids [B, T]) -> logits [B, T, V]`` (the inference
wrapper ``ue5m3.evaluation.inference.InferenceModel``, whose ``forward_unit`` advances the quantization policy's
work-unit counter once per call) and a tokenizer with ``encode(text) -> list[int]`` and ``eos_id``
(``ue5m3.data.TextTokenizer``).
From the command line (``ue5m3 lm-eval --model ue5m3 --model_args run_dir=...,policy=...``) or from Python
(``lm_eval.simple_evaluate(model="ue5m3", model_args="run_dir=...,policy=...", ...)`` after importing this module),
the model is loaded lazily through ``ue5m3.evaluation.inference.load_for_inference``; the tokenizer and
``max_length`` default to the run's own (its ``config.resolved.json`` data section: the tokenizer file
``data.tokenizer_path`` or ``<data.data_dir>/tokenizer.json``, and ``data.sequence_length``), and explicit
``tokenizer=`` / ``max_length=`` values win.

Work units and order. Requests are scored in the FIXED order lm-eval hands them over (never re-sorted by length),
``batch_size`` at a time; each batch is ONE ``forward_unit`` call on a right-padded ``[B, T]`` tensor (pad id =
EOS), so batch ``k`` of a run is always the policy's work unit ``k``. The models are causal, so right padding does
not change the logits at the real positions in exact arithmetic; under FP4 recipes whose scales span the whole
tensor (per-tensor amax), the padding rows take part in that amax, exactly as in a padded batch-8 evaluation of
the paper. ``n_units`` counts the calls made.

Slicing. A request ``(context, continuation)`` arrives as token lists; the model sees
``(context + continuation)[-(max_length + 1):][:-1]`` (left truncation, the last token is never an input) and the
continuation's log-probabilities are read from the last ``len(continuation)`` positions of that input.
``loglikelihood_rolling`` scores a whole text in disjoint windows of ``max_length`` predicted tokens, the first
conditioned on EOS, each later one on the ``max_length - len(window)`` tokens before it (lm-eval's
``get_rolling_token_windows`` with ``context_len = 1`` and ``make_disjoint_window``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import lm_eval.models  # noqa: F401  # lm-eval's own models first: its registry loads them only while it is empty
import torch
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from ue5m3.logs import Progress

__all__ = ["UE5M3LM"]

logger = logging.getLogger(__name__)

_OWN_ARGS = ("batch_size", "max_length", "device")


@register_model("ue5m3")
class UE5M3LM(TemplateLM):
    """lm-eval model over a ``forward_unit`` callable and a ``TextTokenizer``-like tokenizer.

    Args:
        model: object with ``forward_unit(input_ids: LongTensor[B, T]) -> FloatTensor[B, T, V]``.
        tokenizer: object with ``encode(text) -> list[int]`` and ``eos_id`` (used as end-of-text, the empty-context
            prefix, the rolling-window prefix and the pad id).
        batch_size: requests per ``forward_unit`` call (the policy's work unit); the paper evaluates with 8.
        max_length: most tokens fed to the model in one row; longer inputs are left-truncated.
        device: where input ids are placed; default: the device of the model's first parameter, else CPU.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 8,
        max_length: int = 2048,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if not callable(getattr(model, "forward_unit", None)):
            raise TypeError(f"model must have a forward_unit(input_ids) method, got {type(model).__name__}")
        for name in ("encode", "eos_id"):
            if not hasattr(tokenizer, name):
                raise TypeError(f"tokenizer must have {name!r} (like ue5m3.data.TextTokenizer)")
        batch_size, max_length = int(batch_size), int(max_length)
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"batch_size and max_length must be >= 1, got {batch_size} and {max_length}")
        self.model = model
        self.ue5m3_tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self._device = torch.device(device) if device is not None else _model_device(model)
        self.n_units = 0

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> UE5M3LM:
        """``run_dir=..,policy=..[,step=..,tokenizer=..,max_length=..,recipe=..,force_bf16=..,batch_size=..,device=..]``.

        The model comes from ``ue5m3.evaluation.inference.load_for_inference(run_dir, step, policy=..., recipe=...,
        force_bf16=..., device=...)`` (it may also return ``(model, tokenizer)``). The tokenizer is, in this order:
        ``ue5m3.data.load_tokenizer(tokenizer)`` when ``tokenizer=`` (a ``tokenizer.json`` path) is given, the one
        the loader supplied, or the run's own (``ue5m3.data.open_tokenizer`` of the data section of the run's
        ``config.resolved.json``). ``max_length`` is, in this order, the ``max_length=`` model arg, lm-eval's own
        ``max_length`` setting, or the run's ``data.sequence_length``.
        """
        return cls.create_from_arg_obj(lm_utils.simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None) -> UE5M3LM:
        """Same as :meth:`create_from_arg_string` from an already parsed dict (lm-eval's CLI passes one)."""
        args = dict(arg_dict)
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        if str(extra.get("device", "")).startswith("cuda") and not torch.cuda.is_available():
            extra.pop("device")  # lm-eval's CLI default is cuda; fall back to CPU as its HF model does
        for key in ("batch_size", "max_length", "device"):
            if key in extra and key not in args:
                args[key] = extra[key]
        unknown = args.keys() - {"run_dir", "step", "policy", "recipe", "force_bf16", "tokenizer"} - set(_OWN_ARGS)
        if unknown:
            raise ValueError(f"unknown ue5m3 model_args: {sorted(unknown)}")
        if "run_dir" not in args or "policy" not in args:
            raise ValueError("--model_args for ue5m3 need run_dir=...,policy=... (optionally step=..., tokenizer=...)")
        try:
            from ue5m3.evaluation.inference import load_for_inference
        except ImportError as exc:
            raise ImportError(
                "--model ue5m3 loads checkpoints through ue5m3.evaluation.inference.load_for_inference, which is not "
                f"available in this checkout ({exc}); construct UE5M3LM(model, tokenizer) directly instead"
            ) from exc
        load_kw = {k: args.pop(k) for k in ("recipe", "force_bf16") if k in args}
        if args.get("device") is not None:
            load_kw["device"] = args["device"]
        run_dir = str(args.pop("run_dir"))
        loaded = load_for_inference(run_dir, args.pop("step", None), policy=args.pop("policy"), **load_kw)
        model, tokenizer = loaded if isinstance(loaded, tuple) else (loaded, getattr(loaded, "tokenizer", None))
        tokenizer_path = args.pop("tokenizer", None)
        if tokenizer_path is not None:  # an explicit tokenizer wins over the loader's and the run's
            from ue5m3.data import load_tokenizer

            tokenizer = load_tokenizer(str(tokenizer_path))
        if tokenizer is None or "max_length" not in args:
            data = _run_data(run_dir)
            if tokenizer is None:
                from ue5m3.data import open_tokenizer

                tokenizer = open_tokenizer(data)
            args.setdefault("max_length", data.sequence_length)
        bs = args.pop("batch_size", 8)
        if isinstance(bs, str) and bs.startswith("auto"):
            raise ValueError("batch_size=auto is not supported: the batch is the quantization work unit")
        return cls(model, tokenizer, batch_size=int(bs), **args)

    # --- TemplateLM's minimum -------------------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return int(self.ue5m3_tokenizer.eos_id)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Token ids of ``string``; the tokenizer never adds BOS/EOS, so ``add_special_tokens`` is ignored."""
        return list(self.ue5m3_tokenizer.encode(string))

    def _loglikelihood_tokens(
        self,
        requests: Sequence[tuple[Any, list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        """``(sum of continuation log-probs, continuation is the greedy decode)`` per request, in order."""
        results: list[tuple[float, bool]] = []
        progress = Progress("scoring", total=len(requests), unit="request", logger=logger, enabled=not disable_tqdm)
        for start in range(0, len(requests), self.batch_size):
            batch = requests[start : start + self.batch_size]
            rows, n_conts = [], []
            for _, context_enc, continuation_enc in batch:
                if not continuation_enc:
                    raise ValueError("a loglikelihood request has an empty continuation")
                if len(continuation_enc) > self.max_length:
                    raise ValueError(f"continuation of {len(continuation_enc)} tokens exceeds max_length")
                if not context_enc:
                    raise ValueError("a loglikelihood request has an empty context (expected the prefix token)")
                rows.append((list(context_enc) + list(continuation_enc))[-(self.max_length + 1) :][:-1])
                n_conts.append(len(continuation_enc))
            logprobs = self._forward_batch(rows)
            for row, lp, n_cont, (_, _, cont) in zip(rows, logprobs, n_conts, batch, strict=True):
                cont_lp = lp[len(row) - n_cont : len(row)]  # [n_cont, V]: predictions of the continuation tokens
                target = torch.tensor(cont, dtype=torch.long, device=cont_lp.device)
                score = cont_lp.gather(1, target[:, None]).sum().item()
                greedy = bool((cont_lp.argmax(dim=-1) == target).all().item())
                results.append((float(score), greedy))
            progress.update(len(batch), figures={"work_units": self.n_units})
        progress.close()
        return results

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """Total log-likelihood of each text (``Instance.args[0]``), over disjoint ``max_length`` windows."""
        windows: list[tuple[Any, list[int], list[int]]] = []
        owners: list[int] = []
        for i, request in enumerate(requests):
            tokens = self.tok_encode(request.args[0])
            for pair in lm_utils.get_rolling_token_windows(tokens, self.prefix_token_id, self.max_length, 1):
                context, continuation = lm_utils.make_disjoint_window(pair)
                windows.append((None, context, continuation))
                owners.append(i)
        totals = [0.0] * len(requests)
        for owner, (score, _) in zip(owners, self._loglikelihood_tokens(windows), strict=True):
            totals[owner] += score
        return totals

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError(
            "ue5m3 scores loglikelihoods only (OLMES Core 9 / MMLU are multiple-choice); "
            "generation tasks are not supported"
        )

    # --- helpers ------------------------------------------------------------------------------------------------

    def _forward_batch(self, rows: list[list[int]]) -> torch.Tensor:
        """Log-softmax of one right-padded ``forward_unit`` call: ``[B, T, V]`` float32 on CPU-or-device."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.eot_token_id, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        with torch.no_grad():
            logits = self.model.forward_unit(ids.to(self._device))
        self.n_units += 1
        if logits.shape[:2] != ids.shape:
            raise ValueError(
                f"forward_unit returned logits of shape {tuple(logits.shape)} for input {tuple(ids.shape)}"
            )
        return torch.log_softmax(logits.float(), dim=-1)


def _run_data(run_dir: str) -> Any:
    """The data section (``ue5m3.data.DataConfig``) of the run's ``config.resolved.json``."""
    from ue5m3.training.config import read_run_config

    return read_run_config(run_dir).require_data()


def _model_device(model: Any) -> torch.device:
    for candidate in (model, getattr(model, "model", None)):
        params = getattr(candidate, "parameters", None)
        if callable(params):
            for p in params():
                return p.device
    return torch.device("cpu")
