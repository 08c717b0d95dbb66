"""The performance guide as a per-layer roofline: capture -> costs -> roofline -> rules -> report."""
