"""Layer replacement: a small Llama's RMSNorms run the pulled kernel, logits unchanged."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nkikit.registry.pull import pull  # noqa: E402
from nkikit.torch import kernelize, unkernelize  # noqa: E402


@pytest.fixture(scope="module")
def rms(rmsnorm_repo, hub_url: str, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    return pull(
        "nkikit/rmsnorm", version=1, endpoint=hub_url, cache_dir=tmp_path_factory.mktemp("c")
    )


def test_llama_rmsnorm_replacement(rms) -> None:  # noqa: ANN001
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    model = transformers.LlamaForCausalLM(config).eval()  # random weights, nothing downloaded
    for module in model.modules():  # make the norm weights matter (they start at 1)
        if type(module).__name__ == "LlamaRMSNorm":
            module.weight.data.uniform_(0.5, 1.5)
    ids = torch.randint(0, 128, (2, 8))
    with torch.no_grad():
        expected = model(ids).logits
        replaced = kernelize(model, {"RMSNorm": rms})
        assert len(replaced) == 2 * 2 + 1 and "model.norm" in replaced
        got = model(ids).logits
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        assert unkernelize(model) == 5
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)


def test_kernelized_module_compiles(rms) -> None:  # noqa: ANN001
    torch._dynamo.reset()
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 32), torch.nn.RMSNorm(32, eps=1e-5), torch.nn.ReLU()
    )
    x = torch.randn(4, 6, 32)
    with torch.no_grad():
        expected = model(x)
        assert kernelize(model, {"RMSNorm": rms.rmsnorm}) == ["1"]
        got = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_kernelize_errors(rms) -> None:  # noqa: ANN001
    model = torch.nn.Sequential(torch.nn.LayerNorm(8))
    with pytest.raises(KeyError, match="unknown layer kind 'BatchNorm'"):
        kernelize(model, {"BatchNorm": rms})
    with pytest.raises(ValueError, match="has no function 'layernorm'"):
        kernelize(model, {"LayerNorm": rms})
