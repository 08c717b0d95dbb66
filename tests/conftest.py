import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.manual_seed(0)
    yield
