"""The bandwidth probe between the nodes' launchers (and the doctor's agents): who is the slow link.

:mod:`.analysis` judges measured transfers (pure functions); :mod:`.probe` measures them over the
wire/ transport. See docs/communication.md ("The link probe").
"""
