"""Helpers of scripts/mutation.sh: write one module's mutmut config, and score a finished run.

    mutation_report.py config PYPROJECT MODULE TEST...   print PYPROJECT with its [tool.mutmut] table set for MODULE
    mutation_report.py score WORKDIR MODULE EQUIVALENTS [--sample]   print MODULE's counts and score from WORKDIR/mutants/*.meta
                                                     (--sample: of the mutants that were run only)

A score is killed / (all mutants - equivalent ones), where timeouts count as killed (the tests stopped
the mutant: an endless loop) and a mutant no test reaches ("no tests") counts as a survivor.
EQUIVALENTS lists reviewed mutants that cannot change behaviour, one per line: ``NAME  reason``.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for anything a path or an option holds
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def module_config(pyproject: Path, module: str, tests: list[str]) -> str:
    """``pyproject`` with ``[tool.mutmut]`` kept but for ``only_mutate`` (``module``) and the test selection."""
    text = pyproject.read_text()
    shared = dict(tomllib.loads(text).get("tool", {}).get("mutmut", {}))
    shared.pop("tests_dir", None)
    shared["only_mutate"] = [module.rstrip("/") + "/*" if not module.endswith(".py") else module]
    shared["pytest_add_cli_args_test_selection"] = tests
    # drop the table (its header up to the next table's header) and write it anew at the end
    kept = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text).rstrip() + "\n\n[tool.mutmut]\n"
    return kept + "".join(f"{k} = {_toml(v)}\n" for k, v in shared.items())


def _equivalents(path: Path) -> dict[str, str]:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, reason = line.partition(" ")
                out[name] = reason.strip()
    return out


def score(workdir: Path, module: str, equivalents: Path, *, sample: bool = False) -> int:
    from mutmut.stats import status_by_exit_code

    base = workdir / "mutants"
    metas = [base / (module + ".meta")] if module.endswith(".py") else sorted((base / module).rglob("*.py.meta"))
    status: dict[str, str] = {}
    for meta in metas:
        if meta.exists():
            for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
                if sample and code is None:
                    continue  # a sampled run (MUTATION_SAMPLE): the mutants it did not run are not counted
                status[name] = status_by_exit_code[code]
    eq = _equivalents(equivalents)
    counts = {"killed": 0, "timeout": 0, "survived": 0, "no tests": 0, "equivalent": 0, "other": 0}
    survivors, stale = [], []
    for name, st in sorted(status.items()):
        if name in eq:
            counts["equivalent"] += 1
            if st in ("killed", "timeout"):
                stale.append(name)  # listed as equivalent, yet a test tells it apart: review the list
        elif st in counts:
            counts[st] += 1
            if st in ("survived", "no tests"):
                survivors.append((name, st))
        else:
            counts["other"] += 1
            survivors.append((name, st))
    total = len(status)
    live = total - counts["equivalent"]
    killed = counts["killed"] + counts["timeout"]
    pct = 100.0 * killed / live if live else 100.0
    print(
        f"{module}: {total} mutants, {killed} killed ({counts['timeout']} by timeout), "
        f"{counts['survived']} survived, {counts['no tests']} reached by no test, {counts['equivalent']} equivalent, "
        f"{counts['other']} other -> score {pct:.1f}% of {live} non-equivalent"
    )
    by_function: dict[str, list[int]] = {}  # function -> [killed, non-equivalent]
    for name, st in status.items():
        f = by_function.setdefault(name.rpartition("__mutmut_")[0], [0, 0])
        if name not in eq:
            f[1] += 1
            f[0] += st in ("killed", "timeout")
    for f, (k, live_f) in sorted(by_function.items()):
        print(f"    {f}: {k}/{live_f} killed")
    for name, st in survivors:
        print(f"    {st}: {name}")
    for name in stale:
        print(f"    listed as equivalent but killed (remove it from the list): {name}")
    return 0 if total else 1


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "config":
        sys.stdout.write(module_config(Path(argv[1]), argv[2], argv[3:]))
        return 0
    if len(argv) in (4, 5) and argv[0] == "score" and argv[4:] in ([], ["--sample"]):
        return score(Path(argv[1]), argv[2], Path(argv[3]), sample=argv[4:] == ["--sample"])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
