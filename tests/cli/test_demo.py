"""``joynexus demo --success-episodes``: what its help and the README say is what the
demo uses.

Regression: the README gave the defaults as 6 with the fast simulators and 2 with the
paper's, while the demo measured its SFT tenant on 30 episodes.
"""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.demo.mixture import SFT_SUCCESS_EPISODES, SUCCESS_EPISODES

ROOT = Path(__file__).resolve().parents[2]


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_the_help_gives_the_defaults_the_demo_uses() -> None:
    out = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    text = _flat(out.output)
    assert (
        f"Default: {SUCCESS_EPISODES['paper']} per RL tenant with the paper's simulators, "
        f"{SUCCESS_EPISODES['fast']} with the fast ones"
    ) in text
    assert SFT_SUCCESS_EPISODES["paper"] == SFT_SUCCESS_EPISODES["fast"]
    assert f"and {SFT_SUCCESS_EPISODES['fast']} for the SFT tenant" in text


def test_every_doc_stating_the_defaults_states_the_sft_tenants_too() -> None:
    """A paragraph giving ``--success-episodes``' defaults names both of the RL
    tenants' figures and the SFT tenant's."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    stated = 0
    for doc in docs:
        for paragraph in re.split(r"\n\s*\n", doc.read_text()):
            text = _flat(paragraph)
            if "--success-episodes" not in text or "by default" not in text:
                continue
            stated += 1
            where = f"{doc.name}: {text[:200]}"
            assert f"{SUCCESS_EPISODES['fast']} per RL tenant" in text, where
            assert f"{SUCCESS_EPISODES['paper']} with the paper's" in text, where
            assert f"{SFT_SUCCESS_EPISODES['fast']} for the SFT tenant" in text, where
    assert stated >= 1  # the README states them
