"""solo-ext's benchmarks, outside the package: loss kernels, training steps and DALI loaders,
each against references measured in the same process (``python -m benchmarks --help``, from the
repository's root)."""

import sys
from pathlib import Path

# the straightforward losses live with the tests that use them as oracles
_TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
