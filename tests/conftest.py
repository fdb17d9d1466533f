"""Suite-wide test settings."""

from __future__ import annotations

import os

import pytest
import torch

# The command line installs a thread policy that follows the machine's load; the suite keeps the one
# thread below instead (a count that changed mid-test would make bit-exact comparisons flaky).
os.environ["BERTFORGE_THREADS"] = "1"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", default=os.environ.get("BERTFORGE_TEST_DEVICE", "cpu"),
                     help="torch device for the device-independent model, training and checkpoint tests "
                          "(tests/test_device.py): cpu (default) or cuda; also BERTFORGE_TEST_DEVICE.")


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> torch.device:
    """The device the device-independent tests run on. Asking for a GPU that is not there is an error,
    never a silent fall-back to the CPU."""
    chosen = torch.device(pytestconfig.getoption("--device"))
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {chosen}: this torch ({torch.__version__}) sees no CUDA GPU")
    return chosen


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread for every test: the models here are tiny, so threads give nothing, and on a
    busy 2-core machine OpenMP's waiting makes a multi-threaded step several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def torch_dropout_draws(monkeypatch):
    """Dropout masks drawn exactly as torch's F.dropout draws them (as transformers does), for tests
    that compare a training-mode forward pass with transformers' draw for draw."""
    from bertforge.model import layers

    monkeypatch.setattr(layers, "DROPOUT_DRAWS_AS_TORCH", True)
