"""Whether a torch device name can be used here, said in one line before any model loads."""

from __future__ import annotations

from typing import Any


def check_device(device: Any) -> None:
    """Nothing when `device` (a name or a torch.device; None: torch's default) is usable in this process;
    else a one-line ValueError saying what is missing. A CUDA device on a torch built without CUDA (the
    CPU wheel `setup.sh` installs) would otherwise fail deep in the first `.to()` with a long traceback."""
    if device is None:
        return
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r}: not a torch device (cpu, cuda, cuda:N, mps)") from None
    if parsed.type != "cuda":
        return
    if not torch.cuda.is_available():
        why = "was built without CUDA" if torch.version.cuda is None else "sees no CUDA GPU"
        raise ValueError(f"device {device}: this torch ({torch.__version__}) {why}; use --device cpu, or install "
                         "a CUDA build of torch (docs/distributed.md)")
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ValueError(f"device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                         f"numbered from 0")
