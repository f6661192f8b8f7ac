"""Run the current nki-samples MX tutorial (``mxfp-matmul``) unmodified on nkikit.

The tutorial is not part of this repository.  Bring a copy of the
``src/nki_samples/tutorials/mxfp-matmul`` folder of ``aws-neuron/nki-samples`` (checked at
``6905a68``), e.g.::

    git -C nki-samples archive HEAD src/nki_samples/tutorials/mxfp-matmul | tar -x -C /tmp/mx
    python -m benchmarks.mxfp /tmp/mx/src/nki_samples/tutorials/mxfp-matmul

Its ``mx_toplevel.py`` needs torch_xla and a Trainium3 device; this runner takes its place:
with the ``import nki`` alias installed (``nkikit.nki.install_alias()``) and the target trn3, it
imports the tutorial's own ``mx_kernels.py`` / ``mx_kernel_utils.py`` (unchanged, from that
folder), builds each case's inputs as ``mx_toplevel.py`` does with the tutorial's
``mx_cpu_utils`` helpers (numpy arrays where it passes torch tensors), runs the kernel on the
simulator and compares with the tutorial's goldens (``nc_matmul_mx_golden``,
``quantize_mx_golden``, or the fp32 matmul) with its own check, ``np.allclose(rtol=5e-2,
atol=5e-2)``.  Each case is also profiled on the cost model (trn3).  One line per case: pass or
fail, the largest error, the modeled time.  Exit status 0 when every case matches.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

TARGET = "trn3"
RTOL = ATOL = 5e-2  # mx_toplevel.compare_and_print_results


def cases(tutorial: Path) -> dict[str, Callable[[], tuple]]:
    """The six runs of ``mx_toplevel.py``'s ``__main__``, each giving (kernel, args, golden)."""
    os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = TARGET
    import nkikit.nki

    nkikit.nki.install_alias()
    sys.path.insert(0, str(tutorial))
    import ml_dtypes as mld
    import mx_cpu_utils as cpu
    import mx_kernels as k
    import nki.language as nl

    x4 = {
        mld.float8_e5m2: nl.float8_e5m2_x4,
        mld.float8_e4m3fn: nl.float8_e4m3fn_x4,
        mld.float4_e2m1fn: nl.float4_e2m1fn_x4,
    }

    def offline(q):
        m, kk, n = 128, 128, 512
        _, _, st, st_s = cpu.generate_stabilized_mx_data(q, (kk, m * 4))
        _, _, mv, mv_s = cpu.generate_stabilized_mx_data(q, (kk, n * 4))
        golden = cpu.nc_matmul_mx_golden(st, mv, st_s, mv_s, q, q)
        return k.kernel_offline_quantized_mx_matmul, (st, st_s, mv, mv_s, x4[q]), golden

    def on_device(qs, qm):
        m, kk, n = 128, 128, 512
        _, _, st, st_s = cpu.generate_stabilized_mx_data(qs, (kk, m * 4))
        mv, _, _, _ = cpu.generate_stabilized_mx_data(qm, (kk, n * 4))
        mq, ms = cpu.quantize_mx_golden(mv, qm)
        golden = cpu.nc_matmul_mx_golden(st, mq, st_s, ms, qs, qm)
        args = (st, st_s, mv.astype(mld.bfloat16), x4[qs], x4[qm])
        return k.kernel_on_device_quantize_matmul_mx, args, golden

    def strided(q, use_tensor_copy):
        kk, m, n = 512, 128, 512
        st, _, _, _ = cpu.generate_stabilized_mx_data(q, (kk, m))
        mv, _, _, _ = cpu.generate_stabilized_mx_data(q, (kk, n))
        args = (st.astype(mld.bfloat16), mv.astype(mld.bfloat16), x4[q], use_tensor_copy)
        return k.kernel_copy_strided_quantize_matmul_mx, args, st.T @ mv

    e5, e2 = mld.float8_e5m2, mld.float4_e2m1fn
    return {
        "offline_quantized fp8@fp8": lambda: offline(e5),
        "offline_quantized fp4@fp4": lambda: offline(e2),
        "on_device_quantize fp4@fp8": lambda: on_device(e2, e5),
        "on_device_quantize fp8@fp8": lambda: on_device(e5, e5),
        "copy_strided tensor_copy fp8": lambda: strided(e5, True),
        "copy_strided dma fp8": lambda: strided(e5, False),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.mxfp", description=__doc__.split("\n")[0]
    )
    ap.add_argument("tutorial", type=Path, help="the mxfp-matmul folder of nki-samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args(argv)
    if not (args.tutorial / "mx_kernels.py").is_file():
        ap.error(f"{args.tutorial} has no mx_kernels.py")
    import nkikit

    np.random.seed(args.seed)  # the tutorial's generators draw from numpy's global state
    passed = 0
    table = cases(args.tutorial)
    for name, setup in table.items():
        try:
            kernel, kargs, golden = setup()
            res = np.asarray(kernel(*kargs), dtype=np.float32)
            ok = bool(np.allclose(res, golden, rtol=RTOL, atol=ATOL))
            err = float(np.max(np.abs(res - golden)))
            us = ""
            if not args.no_profile:
                prof = nkikit.profile_kernel(kernel, *kargs, target=TARGET)
                us = f"  modeled {prof.total_us:.2f} us"
            print(f"{'PASS' if ok else 'FAIL'}  {name}: max |error| {err:.3g}{us}")
            passed += ok
        except Exception as e:  # one case's failure is reported, the others still run
            first = traceback.format_exception_only(type(e), e)[-1].strip().splitlines()[0]
            print(f"FAIL  {name}: {first}")
    print(f"{passed}/{len(table)} cases match the tutorial's goldens (target {TARGET})")
    return 0 if passed == len(table) else 1
