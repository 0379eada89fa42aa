"""The README's ten-minute tour runs as written, in order, on a fresh directory.

Regression: a new user following the README found that ``custom_reinforce.py`` after the
quickstart ended in ``429 quota_exceeded``, that the robot snippet fitted no tenant the
README created, and that other documented steps had drifted from what the commands
print. This test reads the tour's code blocks from README.md itself (so the README and
the test cannot drift apart) and runs them as a user would: the bash blocks in one bash
shell (``export`` carries over), the ``joynexus serve`` block as a server of its own,
the Python block with the openpi client's interpreter. Only the ports are changed (to
free ones) and the working directory is a new temporary one holding ``examples/``.

Each ``# → text`` comment is what its step must print: ``<name>`` in it matches one
word and is remembered, so a later command's ``<name>`` is what the earlier step printed
(the tenant's key, pasted as the README tells the reader to).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TOUR_HEADING = "## A ten-minute tour"
STEP_TIMEOUT_S = 300.0
SERVE_START_S = 180.0
EXPECT = "# →"


@dataclass
class Step:
    """One command of the tour and what its output must say."""

    command: str
    expect: list[str] = field(default_factory=list)


@dataclass
class Block:
    lang: str
    steps: list[Step]
    text: str  # the block's code as written (Python blocks run whole)


def tour_blocks(readme: str) -> list[Block]:
    """The fenced bash and python blocks of the tour section, in order."""
    start = readme.index(TOUR_HEADING)
    end = readme.find("\n## ", start + len(TOUR_HEADING))
    section = readme[start : end if end != -1 else None]
    blocks = []
    for lang, code in re.findall(r"```(bash|python)\n(.*?)```", section, flags=re.S):
        blocks.append(Block(lang, _steps(code) if lang == "bash" else _py_steps(code), code))
    return blocks


def _split_expect(line: str) -> tuple[str, str | None]:
    if EXPECT not in line:
        return line, None
    code, _, want = line.partition(EXPECT)
    return code.rstrip(), want.strip()


def _steps(code: str) -> list[Step]:
    steps: list[Step] = []
    for raw in code.splitlines():
        line, want = _split_expect(raw)
        # A comment after two spaces is the reader's (``# paste the key it printed``).
        line = re.split(r"\s{2,}#", line, maxsplit=1)[0].strip()
        if line and not line.startswith("#"):
            steps.append(Step(line))
        if want:
            assert steps, f"an expected output before any command: {raw!r}"
            steps[-1].expect.append(want)
    return steps


def _py_steps(code: str) -> list[Step]:
    wants = [w for line in code.splitlines() if (w := _split_expect(line)[1])]
    return [Step("python", wants)]


def _pattern(want: str, seen: dict[str, str] | None = None) -> re.Pattern[str]:
    """``<name>`` matches one word (captured), or what an earlier step printed as it;
    whitespace matches any whitespace."""
    parts = re.split(r"(<[a-z ]+>)", want)
    out = []
    for part in parts:
        if re.fullmatch(r"<[a-z ]+>", part):
            name = re.sub(r"\W", "_", part[1:-1])
            known = (seen or {}).get(name)
            out.append(re.escape(known) if known else f"(?P<{name}>[^\\s,)\\]]+)")
        else:
            out.append(r"\s+".join(re.escape(w) for w in part.split(" ")))
    return re.compile("".join(out))


def check_output(step: Step, output: str, seen: dict[str, str]) -> None:
    for want in step.expect:
        found = _pattern(want, seen).search(output)
        assert found, f"`{step.command}` no longer prints {want!r}; it printed:\n{output[-3000:]}"
        seen.update(found.groupdict())


class Shell:
    """One bash process, fed a command at a time (exports carry over, like a terminal)."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, command: str, timeout_s: float = STEP_TIMEOUT_S) -> tuple[int, str]:
        marker = f"@@done-{uuid.uuid4().hex}"
        assert self.proc.stdin is not None
        # Braces keep exports in this shell; stdin is the terminal's, never the script.
        self.proc.stdin.write(f"{{ {command}\n}} < /dev/null\necho; echo {marker} $?\n")
        self.proc.stdin.flush()
        out: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(
                    f"`{command}` ran past {timeout_s:g} s: {''.join(out)}"
                ) from None
            assert line is not None, f"the shell exited during `{command}`: {''.join(out)}"
            if line.startswith(marker):
                return int(line.split()[1]), "".join(out)
            out.append(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


class Server:
    """The tour's ``joynexus serve`` command, run in a process group of its own."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_until_up(self, url: str) -> None:
        import time

        deadline = time.monotonic() + SERVE_START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"serve exited: {self.output()[-3000:]}"
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"serve did not answer /healthz: {self.output()[-3000:]}")

    def interrupt(self) -> int:
        """Ctrl-C, as in the server's terminal; its exit status."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            raise AssertionError(f"serve ignored Ctrl-C: {self.output()[-3000:]}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def test_the_readme_tour_parses_into_the_documented_steps() -> None:
    """The parser finds every step the tour promises, so the run below covers them."""
    blocks = tour_blocks(README.read_text())
    commands = [s.command for b in blocks for s in b.steps]
    text = "\n".join(commands)
    for needed in (
        "joynexus spec check",
        "joynexus run",
        "joynexus serve",
        "joynexus tenants create",
        "joynexus submit",
        "joynexus status",
        "examples/quickstart.py",
        "examples/custom_reinforce.py",
        "joynexus export",
    ):
        assert needed in text, f"the README's tour no longer runs `{needed}`"
    assert [b.lang for b in blocks][-1] == "python", "the robot (openpi) snippet ends the tour"
    assert "openpi_client" in blocks[-1].text
    # Every command says what it prints (an ``export`` prints nothing), so the run
    # checks more than exit statuses.
    quiet = [
        s.command
        for b in blocks
        for s in b.steps
        if not s.expect and not s.command.startswith("export ")
    ]
    assert not quiet, f"tour steps that say nothing of their output: {quiet}"
    assert _pattern("API key: <key>").search("API key: jnx_abc-1")["key"] == "jnx_abc-1"  # type: ignore[index]


@pytest.mark.slow
@pytest.mark.timeout(900)  # a bound for a loaded box; the tour takes about two minutes alone
def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    from joynexus.bench.robots import openpi_python
    from joynexus.bench.server_procs import free_port

    openpi = openpi_python()
    if not openpi.is_file():
        pytest.fail(
            f"the openpi client venv ({openpi}) is missing; build it with "
            "`bash scripts/install-python-extras.sh .venv/bin/python` (make install does)"
        )
    http_port, openpi_port = free_port(), free_port()
    readme = README.read_text()
    start = readme.index(TOUR_HEADING)
    tour = readme[start:]
    assert "8000" in tour and "8001" in tour, "the tour's ports changed: update this test"
    # Free ports for the documented 8000/8001 (a CI box may have them taken).
    tour = re.sub(r"\b8001\b", str(openpi_port), re.sub(r"\b8000\b", str(http_port), tour))
    blocks = tour_blocks(tour)

    (tmp_path / "examples").symlink_to(ROOT / "examples")  # a fresh directory, as in a clone
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("JOYNEXUS_")},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "NO_COLOR": "1",
        "TERM": "dumb",
        "COLUMNS": "200",
        "PYTHONUNBUFFERED": "1",  # the server's log as a terminal shows it, line by line
    }
    seen: dict[str, str] = {}
    shell = Shell(tmp_path, env)
    server: Server | None = None
    try:
        for block in blocks:
            if block.lang == "python":
                script = tmp_path / "robot.py"
                script.write_text(block.text)
                rc, out = shell.run(f"{openpi} robot.py")
                assert rc == 0, f"the openpi snippet failed:\n{out[-3000:]}"
                check_output(block.steps[0], out, seen)
                continue
            for step in block.steps:
                command = step.command
                for name, value in seen.items():
                    command = command.replace(f"<{name.replace('_', ' ')}>", value)
                if command.startswith("joynexus serve"):
                    assert server is None, "the tour starts one server"
                    server = Server(command, tmp_path, env, tmp_path / "serve.log")
                    server.wait_until_up(f"http://127.0.0.1:{http_port}")
                    check_output(step, server.output(), seen)
                    continue
                rc, out = shell.run(command)
                assert rc == 0, f"`{command}` exited {rc}:\n{out[-3000:]}"
                check_output(step, out, seen)
        assert server is not None, "the tour never started the server"
        assert "key" in seen, "the tour never created a tenant key"
        rc = server.interrupt()
        assert rc in (0, -signal.SIGINT, 130), f"serve exited {rc}: {server.output()[-3000:]}"
        log = server.output()
        assert "Traceback" not in log, log[-3000:]
        assert "leaked shared_memory" not in log, log[-3000:]
    finally:
        if server is not None:
            server.kill()
        shell.close()
