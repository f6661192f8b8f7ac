"""Key averages count a CPU fallback once per outermost ATen op that launched no kernel."""

from __future__ import annotations

from nkikit.profiler.system import KernelRun, key_averages


def _op(name: str, ts: float, dur: float) -> dict:
    return {"name": name, "ts": ts, "dur": dur, "tid": 1}


def _run(start: float, end: float) -> KernelRun:
    return KernelRun(
        index=0, kernel="mul_kernel", thread=1, trace_start=start, compile_start=start,
        launch_start=start, launch_end=end, device_start=0.0, device_end=5.0, sim_us=1.0,
        traced=False, compiled=False, core=0, profile=None,
    )  # fmt: skip


def test_nested_host_ops_inside_a_kernel_op_are_not_fallbacks() -> None:
    host = [
        _op("aten::mul", 0, 100),  # the device op: launches a kernel at 40-60
        _op("aten::mul", 10, 5),  # the dispatcher's own host call inside it
        _op("aten::cumsum", 200, 50),  # ran on the CPU: a fallback
        _op("aten::add", 210, 10),  # part of the cumsum fallback, not a second one
        _op("dynamo", 300, 50),  # not an ATen op
        _op("aten::view", 400, 1),  # metadata only
    ]
    rows = {(r.kind, r.name): r for r in key_averages(host, [_run(40, 60)])}
    assert rows["op", "aten::mul"].calls == 2 and rows["op", "aten::mul"].fallbacks == 0
    assert rows["op", "aten::cumsum"].fallbacks == 1
    assert rows["op", "aten::add"].fallbacks == 0
    assert rows["op", "dynamo"].fallbacks == 0
    assert rows["op", "aten::view"].fallbacks == 0
    assert rows["kernel", "mul_kernel"].device_total_us == 5.0
