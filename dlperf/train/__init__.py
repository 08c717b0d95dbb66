"""The record ResNet-50 recipe as a trainer: recipes -> speedups -> loop, checkpoints, metrics."""
