"""The README's examples run as written: every ```python block of README.md is executed in a fresh namespace, and
every `ue5m3 <verb>` and `make <target>` that README.md and docs/*.md show in code names a real verb or target.

The Python blocks of docs/*.md are fragments of a pipeline (they need a prepared data directory or a trained run),
so they are only compiled here; what they call is covered by the tests of those modules.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from ue5m3 import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
SLOW = ("fit(",)  # the emulator-identification example fits the whole candidate grid (about 30 s on 2 cores)


def _blocks(path: Path, language: str) -> list[tuple[int, str]]:
    """(first line, source) of every fenced block of ``language`` in ``path``."""
    text = path.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == language]


def _readme_cases() -> list:
    cases = []
    for line, source in _blocks(README, "python"):
        marks = [pytest.mark.slow] if any(s in source for s in SLOW) else []
        cases.append(pytest.param(line, source, id=f"README.md:{line}", marks=marks))
    return cases


def test_the_readme_has_python_examples():
    assert len(_blocks(README, "python")) >= 3


@pytest.mark.parametrize(("line", "source"), _readme_cases())
def test_readme_python_block_runs(line, source):
    code = compile(source, f"README.md, block at line {line}", "exec")
    exec(code, {"__name__": "__readme__"})  # a fresh namespace: each block imports what it uses


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_python_blocks_compile(path):
    for line, source in _blocks(path, "python"):
        compile(source, f"{path.name}, block at line {line}", "exec")


def _verbs() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _code(path: Path) -> list[str]:
    """The commands a Markdown file shows: its fenced blocks other than Python and its inline code spans."""
    text = path.read_text(encoding="utf-8")
    fenced = [m.group(2) for m in FENCE.finditer(text) if m.group(1) not in ("python", "yaml")]
    return fenced + CODE_SPAN.findall(FENCE.sub("", text))


def _mentioned(pattern: str) -> set[tuple[str, str]]:
    found = set()
    for path in [README, *DOCS]:
        for code in _code(path):
            found |= {(path.name, name) for name in re.findall(pattern, code)}
    return found


def test_every_ue5m3_verb_the_docs_show_exists():
    verbs = _verbs()
    mentioned = _mentioned(r"(?<![\w.-])ue5m3 ([a-z][a-z0-9-]*)")
    assert mentioned, "no `ue5m3 <verb>` found: the pattern is broken"
    unknown = sorted((where, verb) for where, verb in mentioned if verb not in verbs)
    assert not unknown, f"verbs shown in the docs that `ue5m3` does not have: {unknown}; it has {sorted(verbs)}"


def test_the_readme_verb_list_is_the_cli():
    """The README's sentence lists exactly the verbs the workflow's rules call, then every other verb of the CLI."""
    text = README.read_text(encoding="utf-8")
    listed = re.search(
        r"`ue5m3 --help` lists the command-line verbs the rules call: (.*?); and the verbs for users: (.*?)\.\n",
        text,
        re.S,
    )
    assert listed, "the README no longer lists the verbs"
    by_rules, for_users = (set(CODE_SPAN.findall(part)) for part in listed.groups())
    rules = " ".join(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk"))
    called = set(re.findall(r"(?:\bue5m3|\{params\.launcher\}) ([a-z][a-z0-9-]+)", rules)) & set(_verbs())
    assert by_rules == called, f"listed, not called: {sorted(by_rules - called)}; unlisted: {sorted(called - by_rules)}"
    assert by_rules | for_users == set(_verbs()), sorted(set(_verbs()) ^ (by_rules | for_users))


@pytest.mark.parametrize("verb", sorted({verb for _, verb in _mentioned(r"(?<![\w.-])ue5m3 ([a-z][a-z0-9-]*)")}))
def test_every_shown_verb_prints_its_help(verb, capsys):
    if verb not in _verbs():
        pytest.skip(f"unknown verb {verb!r} (reported by test_every_ue5m3_verb_the_docs_show_exists)")
    with pytest.raises(SystemExit) as exit_info:
        cli.main([verb, "--help"])
    assert exit_info.value.code == 0
    assert f"ue5m3 {verb}" in capsys.readouterr().out


def test_every_make_target_the_docs_show_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", makefile, re.M))
    mentioned = _mentioned(r"(?<![\w.-])make ([a-z][\w-]*)")
    assert mentioned
    unknown = sorted((where, target) for where, target in mentioned if target not in targets)
    assert not unknown, f"make targets shown in the docs that the Makefile lacks: {unknown}"
