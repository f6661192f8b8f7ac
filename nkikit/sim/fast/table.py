"""The table-driven mode of code generation, for large unrolled kernels.

CPython compiles a function in time that grows faster than its length, and unrolled code
would be one line of source per instruction.  Instead, in a kernel with more than
``TABLE_ABOVE`` statements, each statement's code becomes a *template* (its tensors,
constants and integers turned into parameters), equal templates are compiled once, and a
body is a loop over a table of (template, arguments).  The per-tensor setup (arena views,
forwarding buffers, shadows) is a loop over constant tables too.  Smaller kernels keep
every tensor in a local of one straight-line function.
"""

from __future__ import annotations

import re
from typing import Any

TABLE_ABOVE = 2048  # kernels with more statements than this are table-driven
TABLE_BODY = 256  # bodies with more statements than this are table-driven as well

# what a template turns into parameters: tensor slots (m5, b5, s5), namespace constants
# (DT3, OP12, ...) and integer literals (not digits of a name or of a float literal); the
# word boundary first, so that most positions fail at once
_TEMPLATE_TOKEN = re.compile(r"\b(?:[mbs]\d+\b|[A-Z]+\d+\b|(?<![.])(?<![eE][-+])\d+(?![\w.]))")


class TableMode:
    """Mixed into the compiler: ``table`` emits a body as a loop over templates.  Uses the
    compiler's ``lines``, ``ns``, ``tensors``, ``const``, ``emit`` and ``statements``;
    ``templates``, ``chunks`` and ``bound`` are set up by ``Compiler.build``."""

    templates: dict[str, int]  # template text -> index
    chunks: list[str]  # the template functions' source
    bound: list[str]  # loop variables in scope, passed on to templates
    ints: dict[int, int]  # one object per integer in the argument tables
    _signatures: dict[tuple[int, int, int], tuple[list[str], str]]

    def table(self, stmts: list, depth: int) -> None:
        """Emit ``stmts`` table-driven: each statement's code as a call of a template
        function with its arguments, the calls as a loop over a constant table.  A
        template's tensors come from ``mem`` (``V`` for reshaped views; ``B``, ``S`` for
        forwarding buffers and shadows), which every assignment to a tensor's local also
        updates, so each statement sees what the ones before it left."""
        rows = []
        for i in range(len(stmts)):
            saved, self.lines = self.lines, []
            self.statements(stmts, i, i + 1, 1)
            lines, self.lines = self.lines, saved
            if lines:
                rows.append(self.template(lines))
        bound = "".join(f"{n}, " for n in self.bound)
        self.emit(f"for a in {self.const(rows, 'TABLE')}:", depth)
        self.emit(f"T[a[0]](mem, interp, env, V, B, S, {bound}*a)", depth + 1)

    def _signature(self, n_uids: int, n_args: int) -> str:
        """A template's parameters: the program's state, the loop variables in scope, the
        row's template index, its tensors' uids and its other arguments."""
        key = (len(self.bound), n_uids, n_args)
        sig = self._signatures.get(key)
        if sig is None or sig[0] != self.bound:
            text = ", ".join(
                [
                    "mem, interp, env, V, B, S",
                    *self.bound,
                    "_",
                    *(f"u{j}" for j in range(n_uids)),
                    *(f"a{j}" for j in range(n_args)),
                ]
            )
            sig = self._signatures[key] = (list(self.bound), text)
        return sig[1]

    def template(self, lines: list[str]) -> tuple:
        """(template index, *arguments) for the code ``lines`` of one statement."""
        # tokens in order of first appearance get their names: slots L0, L1, ...,
        # constants and integers a0, a1, ... (found and split out by the C regex engine;
        # only the distinct tokens are looked at in Python)
        text = "\n".join(lines)
        tokens = _TEMPLATE_TOKEN.findall(text)
        names: dict[str, str] = {}
        slots: dict[str, str] = {}
        args: list[Any] = []
        for tok in dict.fromkeys(tokens):
            if tok[0] in "mbs":  # a slot; constants start upper case, integers with a digit
                names[tok] = slots[tok] = f"L{len(slots)}"
            else:
                names[tok] = f"a{len(args)}"
                if tok[0].isupper():
                    args.append(self.ns[tok])
                else:
                    args.append(self.ints.setdefault(int(tok), int(tok)))
        pieces = _TEMPLATE_TOKEN.split(text)
        body = pieces[0] + "".join(map(str.__add__, map(names.__getitem__, tokens), pieces[1:]))
        head, uids = [], []
        for tok, name in slots.items():
            uid = int(tok[1:])
            if tok[0] == "m":
                store = "V" if self.tensors[uid].base is not None else "mem"
            else:
                store = "B" if tok[0] == "b" else "S"
            head.append(f"    {name} = {store}[u{len(uids)}]\n")
            uids.append(self.ints.setdefault(uid, uid))
        text = f"({self._signature(len(uids), len(args))}):\n{''.join(head)}{body}"
        k = self.templates.get(text)
        if k is None:
            k = self.templates[text] = len(self.chunks)
            self.chunks.append(f"def _t{k}{text}")
        return (k, *uids, *args)
