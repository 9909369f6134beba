"""Verdicts: the rules live in :mod:`.rules` (one module per rule, a registry, a graph of causes).

This module keeps the names other modules and older code import from here.
"""

from __future__ import annotations

from .rules import KINDS, SAY, judge, say
from .rules.base import IN_STEP, OWN_PHASES, WAIT_PHASES, no_phase, own_time

__all__ = ["KINDS", "SAY", "judge", "say", "own_time", "no_phase", "WAIT_PHASES", "OWN_PHASES", "IN_STEP"]
