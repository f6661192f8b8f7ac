"""``python -m benchmarks.nki0x``: the NKI 0.x size benchmark (see run.py)."""

from benchmarks.nki0x.run import main

main()
