"""Integer inputs through the registry and the torch binding: the library's cross_entropy,
published and pulled, takes int64 class targets as torch users have them (kernel.toml:
``input_dtypes = { targets = ["int32", "int64"] }``), on a vocabulary wider than bfloat16 can
index exactly (integers above 256 are not all representable in bf16)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hubfixtures import LIBRARY  # noqa: E402

from nkikit.registry.errors import KernelCallError  # noqa: E402
from nkikit.registry.publish import publish  # noqa: E402
from nkikit.registry.pull import pull  # noqa: E402
from nkikit.torch.convert import from_numpy, to_numpy  # noqa: E402

F = torch.nn.functional
V = 300  # > 256: classes 257, 259, ... have no exact bfloat16


@pytest.fixture(scope="module")
def ce(hub_url: str, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    publish(
        LIBRARY / "cross_entropy",
        "nkikit/cross-entropy-int-targets",
        endpoint=hub_url,
        run_tests=False,
        neuron=False,
    )
    return pull(
        "nkikit/cross-entropy-int-targets",
        version=1,
        endpoint=hub_url,
        cache_dir=tmp_path_factory.mktemp("c"),
    )


def _case(n: int = 130, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, V, generator=g) * 3).to(torch.bfloat16)
    targets = torch.randint(0, V, (n,), generator=g)  # int64, as torch makes them
    targets[:4] = torch.tensor([257, 299, 259, 0])  # not representable in bf16 (but 0)
    targets[7] = -100  # torch's ignore_index: loss 0
    return logits, targets


def test_pulled_manifest_declares_int_targets(ce) -> None:  # noqa: ANN001
    spec = ce.cross_entropy.spec
    assert spec.accepted_dtypes("targets") == ("int32", "int64")
    assert spec.accepted_dtypes("logits") == ("float32", "bfloat16")


def test_int64_targets_match_torch_cross_entropy_bf16(ce) -> None:  # noqa: ANN001
    logits, targets = _case()
    assert targets.dtype == torch.int64
    got = ce.cross_entropy(logits, targets)
    assert got.dtype == torch.bfloat16 and got.shape == (130,)
    want = F.cross_entropy(logits.double(), targets, reduction="none", ignore_index=-100)
    # bf16 output: one rounding of values up to ~20
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=2e-2)
    # the rows whose class bf16 cannot hold: a target rounded to a neighbouring class would be
    # off by the difference of two logits (order 3 here), far outside the tolerance
    torch.testing.assert_close(got[:4].double(), want[:4], rtol=1e-2, atol=2e-2)
    assert got[7] == 0
    # int32 targets, the dispatcher and the numpy path (int64 numpy targets) agree bit for bit
    from_np = ce.cross_entropy(to_numpy(logits), targets.numpy())
    assert isinstance(from_np, np.ndarray)
    for same in (
        ce.cross_entropy(logits, targets.to(torch.int32)),
        ce.cross_entropy.op(logits, targets),
        from_numpy(from_np),
    ):
        torch.testing.assert_close(same, got, rtol=0, atol=0)


def test_gradients_with_int_targets(ce) -> None:  # noqa: ANN001
    logits, targets = _case(n=64, seed=1)
    x = logits.float().requires_grad_()
    loss = ce.cross_entropy(x, targets).sum() / (targets != -100).sum()
    (gx,) = torch.autograd.grad(loss, (x,))
    x64 = x.detach().double().requires_grad_()
    ref = F.cross_entropy(x64, targets, ignore_index=-100)
    (rx,) = torch.autograd.grad(ref, (x64,))
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx.double(), rx, rtol=1e-5, atol=1e-6)
    # the backward op returns zeros for the integer input; autograd gets no gradient for it
    grads = ce.cross_entropy.torch.backward_op(torch.ones(64), x.detach(), targets)
    assert grads[1].dtype == torch.int64 and not grads[1].any()


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_gradcheck_opcheck_compile_with_int_targets(ce) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    op = ce.cross_entropy.op
    # gradcheck perturbs every logit (two calls each): a narrow vocabulary keeps it quick
    small = torch.randn(4, 20, requires_grad=True)
    t_small = torch.tensor([0, 19, -100, 7])
    assert torch.autograd.gradcheck(
        lambda a: op(a, t_small), (small,), eps=1e-2, atol=1e-2, rtol=1e-2
    )
    x = torch.randn(6, V, requires_grad=True)
    t = torch.tensor([0, 299, 257, -100, 5, 5])
    for args in ((x, t), (x.detach().bfloat16(), t.to(torch.int32))):
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, result
    torch._dynamo.reset()

    def mean_loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ce.cross_entropy(a, b).mean()

    mean_loss(x, t).backward()
    eager = x.grad.clone()
    x.grad = None
    torch.compile(mean_loss, fullgraph=True)(x, t).backward()
    torch.testing.assert_close(x.grad, eager)


def test_float_targets_are_refused(ce) -> None:  # noqa: ANN001
    logits, targets = _case(n=8)
    with pytest.raises(
        KernelCallError,
        match=r"input 'targets' has dtype bfloat16; this kernel supports int32, int64",
    ):
        ce.cross_entropy(logits, targets.to(torch.bfloat16))
    with pytest.raises(KernelCallError, match="input 'targets' has dtype float32"):
        ce.cross_entropy(logits.float().numpy(), targets.float().numpy())
