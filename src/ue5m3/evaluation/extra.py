"""The ``eval`` extra: the optional packages of downstream evaluation, and the error that names the extra to install.

``pip install "ue5m3[eval]"`` brings lm-eval (``ue5m3 lm-eval``, ``ue5m3 evaluate-downstream``) and what lm-eval's own
``--model hf`` backend imports (transformers, accelerate; pyproject.toml). Without them those verbs stop before any
work with a :class:`MissingExtra` naming the module and the install command (the command line exits with status 2),
never with a bare ``ModuleNotFoundError`` (style rule 14).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

__all__ = ["INSTALL", "MODULES", "MissingExtra", "missing_extra", "require"]

INSTALL = 'pip install "ue5m3[eval]"'
"""The command that installs the extra."""
MODULES = {"lm_eval": "lm-eval", "transformers": "transformers", "accelerate": "accelerate"}
"""The extra's top-level modules -> the distributions that install them."""


class MissingExtra(ImportError):
    """A module of the ``eval`` extra is not installed."""


def _error(what: str, module: str) -> MissingExtra:
    distribution = MODULES.get(module.partition(".")[0])
    package = f"{distribution} " if distribution else ""
    return MissingExtra(
        f"{what} needs {package}(no module named {module!r}), which the eval extra installs: {INSTALL}",
        name=module,
    )


def missing_extra(err: ModuleNotFoundError, what: str) -> MissingExtra | None:
    """The :class:`MissingExtra` for ``err`` when the missing module is one of :data:`MODULES`, else None."""
    if (err.name or "").partition(".")[0] not in MODULES:
        return None
    return _error(what, err.name or "")


def require(what: str, modules: Iterable[str] = ("lm_eval",)) -> None:
    """Import ``modules`` (of :data:`MODULES`); a missing one, or a missing dependency of one, is a MissingExtra.

    Args:
        what: the command or function that needs them (the error's subject).

    Raises:
        MissingExtra: naming the missing module and :data:`INSTALL`.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:  # the module itself, or a dependency that the extra's install brings
            raise _error(what, err.name or module) from err
