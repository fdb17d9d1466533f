"""Suite-wide test settings."""

from __future__ import annotations

import os

import pytest
import torch

# The command line installs a thread policy that follows the machine's load; the suite keeps the one
# thread below instead (a count that changed mid-test would make bit-exact comparisons flaky).
os.environ["BERTFORGE_THREADS"] = "1"


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread for every test: the models here are tiny, so threads give nothing, and on a
    busy 2-core machine OpenMP's waiting makes a multi-threaded step several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
