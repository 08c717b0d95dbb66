"""The input pipeline: sources -> decode -> augment -> loader (uint8 NHWC batches + labels)."""
