"""`python -m bertforge.cli ...` (and `torchrun ... -m bertforge.cli pretrain ...`)."""

from bertforge.cli import app

app()
