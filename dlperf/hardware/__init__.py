"""Hardware facts: the preset table (`specs`) and this machine's measured ceilings (`probe`)."""
