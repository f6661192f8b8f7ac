"""``python -m benchmarks.docs`` on a docs folder of its own making: a program that passes, one
whose own check prints a mismatch, one the docs show as a violation, one needing jax."""

import importlib.util
import textwrap

import pytest

from benchmarks.docs.run import main

KERNEL = """
    import numpy as np
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def copy(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=t)
        return out
"""


def _write(folder, name, body):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(textwrap.dedent(KERNEL) + textwrap.dedent(body))


@pytest.mark.skipif(importlib.util.find_spec("jax") is not None, reason="jax installed here")
def test_the_docs_runner_counts_what_passes(tmp_path):
    docs = tmp_path / "nki"
    main_block = """
        if __name__ == "__main__":
            x = np.ones((4, 8), np.float32)
            print("NKI and NumPy", "match" if np.array_equal(copy(x), {}) else "differ")
    """
    _write(docs / "examples", "good.py", main_block.format("x"))
    _write(docs / "examples", "bad.py", main_block.format("x + 1"))
    _write(
        docs / "examples",
        "layout-violation.py",
        """
        if __name__ == "__main__":
            copy(np.ones((256, 8), np.float32))
        """,
    )
    (docs / "examples" / "only_jax.py").write_text(
        'import jax\nif __name__ == "__main__":\n    pass\n'
    )
    (docs / "deep-dives" / "src").mkdir(parents=True)
    assert main([str(docs), "--out", str(tmp_path / "out")]) == 1  # bad.py fails
    text = (tmp_path / "out" / "results.md").read_text()
    assert "**2 of 3** example programs" in text
    assert "| `examples/bad.py` | FAIL |" in text and "'differ'" in text
    assert "| `examples/good.py` | pass |" in text
    assert "| `examples/layout-violation.py` | pass |" in text
    assert "err_num_partition_exceed_arch_limit" in text
    assert "not run: needs jax" in text
