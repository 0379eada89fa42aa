"""``joynexus serve`` on a taken port: one line and exit 1, before anything loads.

Regression: a second ``serve`` on a taken port loaded its model, printed "serving on
..." and then died in uvicorn's bind with a traceback.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.cli.ports import check_ports
from joynexus.errors import ConflictError


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another server listens on."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield int(sock.getsockname()[1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_on_a_taken_port_says_so_in_one_line(taken: int, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = CliRunner().invoke(app, ["serve", "--run-dir", str(run_dir), "--port", str(taken)])
    assert out.exit_code == 1, out.output
    assert out.output.strip() == f"error: port {taken} is in use: pick another with --port"
    assert not run_dir.exists()  # nothing was loaded or created


def test_serve_on_a_taken_openpi_port_names_that_option(taken: int, tmp_path: Path) -> None:
    args = ["serve", "--run-dir", str(tmp_path / "run"), "--port", str(_free_port())]
    out = CliRunner().invoke(app, [*args, "--openpi-port", str(taken)])
    assert out.exit_code == 1, out.output
    assert out.output.strip() == f"error: port {taken} is in use: pick another with --openpi-port"


def test_free_ports_pass_and_one_port_twice_does_not() -> None:
    free = _free_port()
    check_ports("127.0.0.1", {"--port": free, "--openpi-port": None})
    with pytest.raises(ConflictError, match=f"--openpi-port {free} is also --port"):
        check_ports("127.0.0.1", {"--port": free, "--openpi-port": free})
