"""Run the NKI documentation's example programs (NKI 0.x) on nkikit, unmodified.

The examples are not part of this repository.  Bring the ``nki`` folder of
``aws-neuron/aws-neuron-sdk`` (the NKI docs' sources), e.g.::

    git -C aws-neuron-sdk archive HEAD nki/examples nki/deep-dives/src | tar -x -C /tmp/docs
    python -m benchmarks.docs /tmp/docs/nki [--out DIR]

Every ``.py`` file under ``examples/`` and ``deep-dives/src/`` that runs as a program (it has an
``if __name__ == "__main__":`` block) runs as the docs say to run it, ``python FILE.py`` in its
own folder, but through ``python -m nkikit.nki`` (``import nki`` and, with no torch-xla
installed, ``import torch_xla`` resolve to nkikit: the PyTorch examples' device is the
emulated NeuronCore).  Nothing in the files is changed.  An example *passes* when it exits 0
and none of its own checks prints a mismatch ("... differ", "... False"); an example the docs
show as a rule violation passes when nkikit refuses it with a named error.  No target is
named: an NKI 0.x kernel is traced for trn3 (NeuronCore-v4, as by AWS's simulator on a machine
with no Neuron chip), which the mxfp deep-dive's instructions need.  Examples for JAX need jax.
A program is a file with a main block or with checks at module level (the ``nki.simulate``
quick start); the other files hold the kernels those programs import.
Results: ``benchmarks/docs/results.md`` (or ``--out DIR``); exit status 0 when every example
that can run here passes.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# examples whose point is a rule the compiler enforces: the error nkikit must give
VIOLATIONS = {"layout-violation.py": "err_num_partition_exceed_arch_limit"}
# packages an example may need that nkikit does not stand in for
FOREIGN = ("jax", "torch_neuronx")
_MISMATCH = re.compile(r"(differ|\bFalse)\s*$", re.MULTILINE)


@dataclass
class Outcome:
    path: str
    status: str  # "pass", "FAIL", or why it was not run
    seconds: float
    detail: str


def programs(root: Path) -> list[Path]:
    """The example files of the docs folder ``root`` that run as programs."""
    found = []
    for sub in ("examples", "deep-dives/src"):
        for p in sorted((root / sub).rglob("*.py")):
            text = p.read_text()
            # a program: a main block, or checks at module level (the simulate quick start)
            if re.search(r"^if __name__ == .__main__.:|^\S.*nki\.simulate\(", text, re.MULTILINE):
                found.append(p)
    return found


def run_one(path: Path, root: Path, timeout: float) -> Outcome:
    rel = str(path.relative_to(root))
    text = path.read_text()
    needs = [m for m in FOREIGN if re.search(rf"^\s*(import|from) {m}\b", text, re.MULTILINE)]
    if needs and all(importlib.util.find_spec(m) is None for m in needs):
        return Outcome(rel, f"not run: needs {', '.join(needs)}", 0.0, "")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    for name in ("NEURON_PLATFORM_TARGET_OVERRIDE", "NKI_NC_VERSION"):  # as the docs run them
        env.pop(name, None)
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "nkikit.nki", path.name],
            cwd=path.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return Outcome(rel, "FAIL", timeout, f"timed out after {timeout:.0f} s")
    seconds = time.perf_counter() - t0
    last = (r.stderr.strip().splitlines() or [""])[-1]
    expected = VIOLATIONS.get(path.name)
    if expected is not None:
        said = [ln for ln in r.stderr.splitlines() if expected in ln and path.name in ln]
        ok = r.returncode != 0 and bool(said)
        detail = f"refused: {said[-1].split('nkikit.errors.')[-1]}" if ok else r.stderr[-500:]
        return Outcome(rel, "pass" if ok else "FAIL", seconds, detail)
    if r.returncode != 0:
        return Outcome(rel, "FAIL", seconds, last)
    bad = _MISMATCH.search(r.stdout)
    if bad:
        return Outcome(rel, "FAIL", seconds, f"its check printed {bad.group(0).strip()!r}")
    checks = len(re.findall(r"(match|True)\s*$", r.stdout, re.MULTILINE))
    return Outcome(rel, "pass", seconds, f"{checks} checks of its own pass" if checks else "")


def markdown(outcomes: list[Outcome], source: str) -> str:
    ran = [o for o in outcomes if not o.status.startswith("not run")]
    passed = sum(o.status == "pass" for o in ran)
    rows = "\n".join(
        f"| `{o.path}` | {o.status} | {o.seconds:.1f} | {o.detail.replace('|', '/')} |"
        for o in outcomes
    )
    return (
        "# The NKI docs' example programs on nkikit\n\n"
        f"`python -m benchmarks.docs` on {datetime.date.today()}, docs of {source}: "
        f"**{passed} of {len(ran)}** example programs that can run here pass, unmodified "
        f"({len(outcomes) - len(ran)} need a package nkikit does not stand in for).\n\n"
        "| example | result | s | detail |\n|---|---|---:|---|\n" + rows + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.docs", description=__doc__.split("\n")[0]
    )
    ap.add_argument("docs", type=Path, help="the nki folder of aws-neuron-sdk")
    ap.add_argument("--out", type=Path, default=HERE, help="folder for results.md")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per example")
    ap.add_argument("--source", default="aws-neuron/aws-neuron-sdk", help="named in results.md")
    args = ap.parse_args(argv)
    if not (args.docs / "examples").is_dir():
        ap.error(f"{args.docs} has no examples/ folder (expected aws-neuron-sdk's nki/)")
    outcomes = []
    for path in programs(args.docs):
        o = run_one(path, args.docs, args.timeout)
        print(f"{o.status:<5} {o.path} ({o.seconds:.1f} s) {o.detail}", flush=True)
        outcomes.append(o)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(markdown(outcomes, args.source))
    ran = [o for o in outcomes if not o.status.startswith("not run")]
    passed = sum(o.status == "pass" for o in ran)
    print(f"{passed}/{len(ran)} example programs pass unmodified")
    return 0 if passed == len(ran) else 1
