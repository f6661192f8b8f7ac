"""``python -m benchmarks.sim``: run the simulator speed benchmark (see run.py)."""

from benchmarks.sim.run import main

main()
