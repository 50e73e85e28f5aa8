"""Gateway overhead benchmark: a lean upstream stub, an open-loop load generator, and a runner that
interleaves direct-to-stub and through-the-gateway runs (see `run.py`)."""
