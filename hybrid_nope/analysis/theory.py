"""The contract name `hybrid_nope.analysis.theory` (DESIGN.md); the module lives in measure/."""
import sys

from hybrid_nope.analysis.measure import theory as _module

sys.modules[__name__] = _module  # One module under both names: same functions, same state.
