"""NKI programs written for torch-xla (the NKI docs' PyTorch examples) run unmodified: under
the alias ``import torch_xla`` is ``nkikit.nki.xla``, whose device is the emulated NeuronCore,
and a kernel called with that device's tensors returns its results there."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nkikit.nki as nki  # noqa: E402
import nkikit.nki.isa as nisa  # noqa: E402
import nkikit.nki.language as nl  # noqa: E402
from nkikit.torch.neuron import neuron_device  # noqa: E402


@nki.jit
def add_one(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def double_in_place(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=x, src=t)
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_kernel_called_with_device_tensors_returns_device_tensors(dtype):
    neuron_device()
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3).to(dtype)
    out = add_one(x.to("neuron"))
    assert out.device.type == "neuron" and out.dtype == dtype
    assert torch.equal(out.cpu(), x + 1)


def test_a_device_tensor_the_kernel_writes_sees_the_write():
    neuron_device()
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4).to("neuron")
    out = double_in_place(x)
    assert torch.equal(x.cpu(), 2 * torch.arange(8.0).reshape(2, 4))
    assert out.device.type == "neuron"


def test_a_tensor_on_another_device_is_still_refused():
    with pytest.raises(TypeError, match="move the tensor from meta to 'cpu'"):
        add_one(torch.empty(2, 4, device="meta"))


def _run(tmp_path, source: str, *, env_path=None):
    src = tmp_path / "user_program.py"
    src.write_text(textwrap.dedent(source))
    env = None
    if env_path is not None:
        import os

        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(env_path), *sys.path]))
    return subprocess.run(
        [sys.executable, "-m", "nkikit.nki", str(src)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


DOCS_STYLE = """
    import torch
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=b)
        nisa.tensor_tensor(dst=x, data1=x, data2=y, op=nl.add)
        nisa.dma_copy(dst=out, src=x)
        return out

    if __name__ == "__main__":
        import torch_xla
        import torch_xla.core.xla_model as xm

        device = torch_xla.device()
        a = torch.ones((4, 3), dtype=torch.float16).to(device=device)
        b = torch.ones((4, 3), dtype=torch.float16, device=xm.xla_device())
        c = add(a, b)
        torch_xla.sync()
        xm.mark_step()
        print(c.device, c.cpu().sum().item())
"""


def test_a_torch_xla_program_runs_unmodified_on_the_emulated_device(tmp_path):
    r = _run(tmp_path, DOCS_STYLE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "neuron:0 24.0"


def test_what_the_stand_in_does_not_emulate_is_named(tmp_path):
    r = _run(
        tmp_path,
        """
        import torch_xla
        try:
            torch_xla.runtime
        except AttributeError as e:
            print(e)
        try:
            torch_xla.device(1)
        except ValueError as e:
            print(e)
        """,
    )
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()
    assert first.startswith("torch_xla.runtime is not emulated") and "xla_device" in first
    assert second == "torch_xla.device(1): nkikit emulates one device, index 0"


def test_a_real_torch_xla_is_not_shadowed(tmp_path):
    real = tmp_path / "site" / "torch_xla"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("WHO = 'the real one'\n")
    r = _run(tmp_path, "import torch_xla\nprint(torch_xla.WHO)\n", env_path=tmp_path / "site")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "the real one"


def test_no_torch_xla_without_the_alias():
    r = subprocess.run(
        [sys.executable, "-c", "import nkikit.nki, sys; print('torch_xla' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.strip() == "False"


def test_values_match_numpy_for_bf16_device_inputs():
    neuron_device()
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((128, 64), dtype=np.float32)).to(torch.bfloat16)
    out = add_one(x.to("neuron")).cpu()
    assert torch.equal(out, add_one(x))  # the same bits as from the host
