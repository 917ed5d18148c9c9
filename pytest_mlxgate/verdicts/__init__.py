"""What every assertion shares: the one check constructor and the one pipeline (`conclude`).

The words themselves (pass, fail, inconclusive, ...) and the rule that reads a verdict off an
interval live in `results/verdicts.py`: standard library only, because the xdist controller reads them.
"""

from __future__ import annotations

from .conclude import Conclusion, MessageFn, Target, check, conclude, given_limits

__all__ = ["Conclusion", "MessageFn", "Target", "check", "conclude", "given_limits"]
