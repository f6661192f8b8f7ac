"""An unmodified NKI 0.x file (``import nki``) runs through ``python -m nkikit.nki``; nothing
is installed under the bare name ``nki`` otherwise."""

import subprocess
import sys
import textwrap


def test_unmodified_import_nki_file_runs(tmp_path):
    src = tmp_path / "user_kernel.py"
    src.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import nki
            import nki.isa as nisa
            import nki.language as nl

            @nki.jit
            def double(x):
                out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
                t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=t, src=x)
                nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
                nisa.dma_copy(dst=out, src=t)
                return out

            x = np.arange(8, dtype=np.float32).reshape(2, 4)
            print(nki.simulate(double)(x).sum())
            """
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "nkikit.nki", str(src)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "56.0"


def test_no_bare_nki_module_without_the_alias():
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import nkikit.nki, importlib.util; print(importlib.util.find_spec('nki'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.strip() == "None"


def test_the_simulator_meta_and_experimental_modules_resolve_under_the_alias(tmp_path):
    # vllm-neuron's NKI_SIMULATOR path calls nki.simulator.simulate_kernel(func, args, kwargs,
    # lnc); NKI 0.2 moved nki.tensor to nki.meta.tensor; 0.6 names nki.experimental.while_loop
    src = tmp_path / "vllm_style.py"
    src.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import nki
            import nki.experimental
            import nki.isa as nisa
            import nki.language as nl
            import nki.meta.tensor
            from nki.simulator import simulate_kernel

            def scale(x, factor):
                out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
                t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=t, src=x)
                nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
                nisa.dma_copy(dst=out, src=t)
                return out

            x = np.arange(8, dtype=np.float32).reshape(2, 4)
            print(simulate_kernel(scale, (x,), {"factor": 3.0}, 1).sum())
            print(nki.meta.tensor is nki.tensor, nki.experimental.while_loop is nl.while_loop)
            """
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "nkikit.nki", str(src)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["84.0", "True", "True"]
