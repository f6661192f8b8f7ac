"""``python -m benchmarks.scale``: run the compiler scale benchmark (see run.py)."""

from benchmarks.scale.run import main

main()
