"""A Hub that cannot be reached or refuses a request is one line naming what failed and what to do, exit
status 2: `push`, and a model given by Hub name. Unreachable endpoints are real ones (a closed local port,
a name under .invalid, which never resolves, RFC 6761); error statuses come from the loopback Hub."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.hub import HubNetworkError, network_problem, reaching_hub
from tests import hub_server
from tests.hub_server import HubError, loopback_hub_fixture  # noqa: F401  (provides the `loopback_hub` fixture)
from tests.tiny_models import save_tiny_encoder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("tiny"), "a great film really dull third row")


def closed_port() -> int:
    """A local port nothing listens on: bound, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_cli(args: list[str], endpoint: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`bertforge ARGS` in a fresh process, so that huggingface_hub reads HF_ENDPOINT at its import."""
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "hf_not_a_token",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0", "BERTFORGE_THREADS": "1"}
    code = "import sys; from bertforge.cli import app; app(sys.argv[1:], prog_name='bertforge')"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    return lines[0]


def test_push_to_a_closed_port_is_one_line(model_dir: Path, tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    line = one_line_error(run_cli(["push", str(model_dir), "me/tiny"], endpoint, tmp_path))
    assert f"push {model_dir} to me/tiny" in line and f"cannot connect to {endpoint}" in line
    assert "HF_ENDPOINT" in line  # what to check


def test_push_to_a_host_that_does_not_resolve_is_one_line(model_dir: Path, tmp_path: Path) -> None:
    line = one_line_error(run_cli(["push", str(model_dir), "me/tiny"], "http://hub.bertforge.invalid", tmp_path))
    assert "cannot be looked up (DNS" in line and "hub.bertforge.invalid" in line


def test_a_hub_name_offline_is_one_line(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    line = one_line_error(run_cli(["inspect", "org/not-cached"], endpoint, tmp_path))
    assert "org/not-cached: no such local directory, and the Hub cannot be reached" in line and f"cannot connect to {endpoint}" in line


def test_push_with_a_token_the_hub_refuses_is_one_line(loopback_hub, model_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_token")  # the loopback Hub answers 401, as the Hub does
    result = CliRunner().invoke(app, ["push", str(model_dir), "me/tiny"])
    assert result.exit_code == 2, result.output
    assert "HTTP 401" in result.output and "HF_TOKEN" in result.output and "hf auth login" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize("status", [403, 503])
def test_an_error_status_is_one_line(loopback_hub, model_dir: Path, monkeypatch, status: int) -> None:
    def refuse(handler, segments):  # every route answers `status`, as a Hub in trouble would
        raise HubError(status, None, "refused by the test")

    monkeypatch.setattr(hub_server._Handler, "_route", refuse)
    monkeypatch.setattr("huggingface_hub.utils._http.time.sleep", lambda seconds: None)  # its 5xx retries
    monkeypatch.setenv("HF_TOKEN", loopback_hub.token)
    result = CliRunner().invoke(app, ["push", str(model_dir), "me/tiny"])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert f"the Hub answered HTTP {status}" in result.output
    assert ("retry later" if status >= 500 else "write access") in result.output


def test_reaching_hub_leaves_other_errors_alone() -> None:
    with pytest.raises(KeyError), reaching_hub("push x"):
        raise KeyError("not a network failure")
    assert network_problem(ValueError("no")) is None


def test_reaching_hub_names_a_timeout() -> None:
    import httpx2

    with pytest.raises(HubNetworkError, match="push x: .* did not answer in time .*HF_HUB_ETAG_TIMEOUT"), \
            reaching_hub("push x"):
        raise httpx2.ReadTimeout("timed out")
