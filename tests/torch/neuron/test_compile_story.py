"""The PyTorch story of ``nkikit demo`` at a small shape: naive eager launches a kernel per op,
torch.rms_norm one, torch.compile one fused kernel no slower than naive on the device."""

from __future__ import annotations

import torch

from nkikit.demo.torch_story import run_torch_story


def test_three_ways_at_a_small_shape(tmp_path, capsys):
    torch._dynamo.reset()
    naive, rms, comp = run_torch_story(tmp_path, 256, 512, "bfloat16")
    assert naive.launches == 6 and rms.launches == 1 and comp.launches == 1
    assert naive.launches > rms.launches and naive.launches > comp.launches
    assert comp.device_us <= naive.device_us and comp.modeled_us < naive.modeled_us
    assert naive.fallbacks == rms.fallbacks == comp.fallbacks == 0
    # numbers come from the cost model: the profiled kernels carry their modeled profiles
    for way in (naive, rms, comp):
        assert all(r.profile is not None for r in way.profile.runs)
        assert way.device_us == sum(r.device_us for r in way.profile.runs) > 0
        for kind in ("trace", "key_averages", "html"):
            assert way.files[kind].exists()
        assert way.max_error < 0.1  # bf16 output of values of magnitude ~ 4
    out = capsys.readouterr().out
    assert "RMSNorm 256x512 bfloat16" in out and "Key averages" in out
    assert (tmp_path / "compile" / "kernel" / "kernel.toml").exists()
