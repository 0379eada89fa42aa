"""Every measured number the README states links to where it was measured, and the docs'
links land.

Regressions: the README said the default demo "takes about 15 minutes ... (14.2 min
measured from a fresh clone)", but 14.2 min was measured with the LIBERO pack beside the
checkout and no measurement said 15. A time in the README must be one recorded, with its
conditions, in docs/RESULTS.md, and every figure (a time, a ratio, a percentage, a size)
must sit inside a link to the RESULTS.md section that measured it. When RESULTS.md
became a reader's page and its notebook moved to docs/results/notes/, links into moved
anchors would have broken silently: every relative link of the README and the docs must
name a file that exists and, for a Markdown file, a heading it has.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "RESULTS.md"
# "14.2 min", "5.7–7.0 min", "15 minutes" (a range counts as its two ends).
TIME = re.compile(r"(\d+(?:\.\d+)?)(?:\s*[–-]\s*(\d+(?:\.\d+)?))?\s*min(?:utes?)?\b")
# A measured figure: a number with a unit of time, a ratio, a share or a size.
FIGURE = re.compile(r"\d+(?:\.\d+)?\s*(?:×|%|min\b|ms\b|s\b|MB\b|GB\b)")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def _minutes(text: str) -> set[str]:
    out: set[str] = set()
    for m in TIME.finditer(text):
        out.update(g for g in m.groups() if g is not None)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in FENCE.sub("", md.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m is None:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _prose(text: str) -> str:
    return FENCE.sub("", text)


def test_readme_wall_times_are_recorded_results() -> None:
    readme = _prose(README.read_text())
    results = RESULTS.read_text()
    claims = _minutes(readme)
    assert claims, "the README states no wall time: the check checks nothing"
    recorded = _minutes(results)
    assert claims <= recorded, f"README times not recorded in docs/RESULTS.md: {claims - recorded}"


def test_every_readme_figure_links_to_where_it_was_measured() -> None:
    # The module table states no measurement; a link's text may span lines.
    readme = "\n".join(
        line for line in _prose(README.read_text()).splitlines() if not line.startswith("|")
    )
    linked = 0
    for text, target in LINK.findall(readme):
        if FIGURE.search(text):
            assert target.startswith("docs/RESULTS.md#"), (
                f"{text!r} links to {target}, not to a section of docs/RESULTS.md"
            )
            linked += 1
    stray = FIGURE.search(LINK.sub("", readme))
    assert stray is None, f"README figure {stray.group(0)!r} is not a link to where it was measured"
    assert linked >= 2, "the README links no measured figure: the check checks nothing"


def _docs() -> list[Path]:
    return [
        README,
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "docs" / "results" / "notes").glob("*.md")),
    ]


def test_relative_links_of_the_readme_and_docs_land() -> None:
    broken: list[str] = []
    checked = 0
    for md in _docs():
        for _, target in LINK.findall(_prose(md.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            checked += 1
            if not dest.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{md.relative_to(ROOT)}: {target} (no such heading)")
    assert checked > 50, checked
    assert not broken, "\n".join(broken)


def test_the_slug_is_githubs() -> None:
    assert (
        slug("The paper's §5.1: multi-tenant vs isolated")
        == "the-papers-51-multi-tenant-vs-isolated"
    )
    assert slug("### 8.1.1 Front processes (issue 26, item 2)".lstrip("# ")) == (
        "811-front-processes-issue-26-item-2"
    )
    assert slug("What `make demo` shows") == "what-make-demo-shows"


def test_the_readme_and_the_results_page_stay_short() -> None:
    """A newcomer reads the README in one sitting and RESULTS.md as a page of claims;
    the detail lives in docs/USAGE.md, docs/OPERATIONS.md and docs/results/notes/."""
    assert len(README.read_text().splitlines()) <= 150
    assert len(RESULTS.read_text().splitlines()) <= 400


def _index() -> dict[str, Path]:
    """The RESULTS.md index: notebook section number -> the notes file that holds it."""
    text = RESULTS.read_text()
    table = text[text.index("## The notebook's sections") :]
    out: dict[str, Path] = {}
    for cells, target in re.findall(r"^\| ([\d., –]+) \| \[[^\]]+\]\(([^)]+)\) \|$", table, re.M):
        for part in cells.split(","):
            a, _, b = part.strip().partition("–")
            if not b:
                out[a] = RESULTS.parent / target
                continue
            # "8.1.1–8.1.11", "11.1–11.3": every number between the two ends
            head, _, lo = a.rpartition(".")
            for n in range(int(lo), int(b.rpartition(".")[2]) + 1):
                out[f"{head}.{n}"] = RESULTS.parent / target
    return out


def test_every_cited_notebook_section_is_in_the_notes_file_the_index_names() -> None:
    """Code and docs cite "docs/RESULTS.md §15.1" or "RESULTS §8.1.11": the index at the
    end of RESULTS.md must name the notes file, and that file must hold the heading."""
    index = _index()
    cited: set[str] = set()
    sources = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *_docs()]
    for path in sources:
        text = path.read_text(errors="replace")
        cited.update(re.findall(r"RESULTS(?:\.md)?`? §(\d+(?:\.\d+)*)", text))
    assert cited, "nothing cites a notebook section: the check checks nothing"
    for number in sorted(cited):
        assert number in index, f"§{number} is cited but not in RESULTS.md's index"
        notes = index[number].read_text()
        assert re.search(rf"^#+ {re.escape(number)}\.? ", notes, re.M), (
            f"§{number}: no such heading in {index[number].name}"
        )
