"""The README.md model card of a published kernel, rendered with jinja2 (templates/card.md.j2).

One card per repo root and one per build variant; they say what the kernel computes, how to
call it (nkikit and HF `kernels`), its functions' signatures and dtypes, the test results that
let it be published, and its modeled performance per target when the compiler could tell.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from .manifest import FunctionSpec, Manifest
from .probe import FunctionProbe
from .testrun import TestReport

VARIANT_NOTES = {
    "torch-cpu": "runs the kernel on the nkikit simulator; torch custom ops on CPU",
    "torch-neuron": "the NKI source for real Trainium (imports rewritten to the Neuron SDK's NKI)",
}

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("nkikit.registry", "templates"),
    autoescape=False,  # markdown, not HTML
    keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined,
)


@dataclass(frozen=True)
class VariantRow:
    variant: str
    id: str

    @property
    def note(self) -> str:
        return VARIANT_NOTES.get(self.variant, "")


def _pct(value: object) -> str:
    return f"{100 * float(value):.1f}%" if isinstance(value, int | float) else "n/a"


def _demote_headings(markdown: str, levels: int = 2) -> str:
    """Push the author's headings down so they nest under the card's own sections."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"^#{1,6} ", line):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out).strip()


def _inputs_text(spec: FunctionSpec) -> str:
    """Each input with its example shape, its own dtypes and its value range when declared."""
    parts = []
    for name in spec.inputs:
        notes = []
        if spec.example.get(name):
            notes.append(f"e.g. `{list(spec.example[name])}`")
        if name in spec.input_dtypes:
            notes.append(" or ".join(spec.input_dtypes[name]))
        if name in spec.ranges:
            lo, hi = spec.ranges[name]
            notes.append(f"values in `[{lo}, {hi})`")
        parts.append(f"`{name}`" + (f" ({'; '.join(notes)})" if notes else ""))
    return ", ".join(parts)


def _dtypes_text(spec: FunctionSpec) -> str:
    """`float32, bfloat16`, then the inputs with dtypes of their own: `; targets: int32, int64`."""
    own = [
        f"; `{n}`: {', '.join(spec.input_dtypes[n])}" for n in spec.inputs if n in spec.input_dtypes
    ]
    return ", ".join(spec.dtypes) + "".join(own)


def _call_args(spec: FunctionSpec) -> str:
    return ", ".join([*spec.inputs, *(f"{k}={v!r}" for k, v in spec.attrs.items())])


def render_card(
    manifest: Manifest,
    repo_id: str,
    *,
    variants: Sequence[VariantRow],
    probes: Mapping[str, FunctionProbe],
    tests: TestReport | None,
    author_readme: str = "",
    variant: str | None = None,
) -> str:
    """The card as markdown with a YAML front matter (license, library, tags)."""
    from .. import __version__

    functions: list[dict[str, Any]] = []
    for name, spec in manifest.functions.items():
        probe = probes.get(name)
        if probe is None:
            outputs_text = "unknown"
        elif probe.returns_tuple:
            outputs_text = f"a tuple of {probe.outputs} arrays"
        else:
            outputs_text = "one array"
        functions.append(
            {
                "spec": spec,
                "call_args": _call_args(spec),
                "inputs_text": _inputs_text(spec),
                "dtypes_text": _dtypes_text(spec),
                "outputs_text": outputs_text,
                "perf": probe.perf if probe else [],
            }
        )
    from .trust import DEFAULT_TRUSTED_ORGS

    cpu_id = next((v.id for v in variants if v.variant == "torch-cpu"), "<id>")
    org = repo_id.split("/", 1)[0]
    return _env.get_template("card.md.j2").render(
        m=manifest,
        license_id=manifest.license.lower(),
        repo_id=repo_id,
        org=org,
        # the usage snippet must run as written: pulls from other orgs need the opt-in
        trusted=org in DEFAULT_TRUSTED_ORGS,
        variants=list(variants),
        variant=variant,
        variant_note=VARIANT_NOTES.get(variant or "", ""),
        functions=functions,
        any_backward=any(s.backward for s in manifest.functions.values()),
        cpu_id=cpu_id,
        tests=tests,
        author_readme=_demote_headings(author_readme) if author_readme else "",
        nkikit_version=__version__,
        python_version=platform.python_version(),
        pct=_pct,
    )
