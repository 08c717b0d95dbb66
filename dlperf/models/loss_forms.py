"""The names of the ``--loss`` forms (models/losses.py, which needs torch): here, without it,
for the command line's choices."""

LOSSES = ("fp32", "half", "fused")
DEFAULT_LOSS = "fp32"
