"""``joynexus bench serving --scenario noisy-neighbour``: a short run on the tiny model
reports every phase with its figures, passes C to the server, and prints its tables."""

import io
import math

import pytest
from rich.console import Console

from joynexus.bench.noisy_neighbour import run_noisy_neighbour_bench
from joynexus.bench.serving_report import print_noisy_neighbour_report

psutil = pytest.importorskip("psutil")


@pytest.mark.timeout(180)
def test_a_short_run_reports_the_victim_beside_the_flood_and_the_reads() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = run_noisy_neighbour_bench(
        duration_s=0.5,
        floods=((1, 8),),
        tenant_batch_rows=4,
        get_data_mib=1,
        get_data_concurrency=2,
    )
    assert result["config"]["tenant_batch_rows"] == 4
    assert result["quiet"]["requests"] > 0 and result["quiet"]["p99_ms"] > 0
    (flood,) = result["floods"]
    assert (flood["flood_clients"], flood["flood_rows"]) == (1, 8)
    assert flood["victim_statuses"] == {200: flood["victim"]["requests"]}
    assert flood["flooder"]["rows_per_s"] > 0
    assert math.isfinite(flood["p99_vs_quiet"]) and flood["p99_vs_quiet"] > 0
    reads = result["get_data"]
    assert reads["concurrency"] == 2 and reads["answered"] >= 1
    # Each answered read carries exactly the MiB stored (as base64 JSON: about 4/3 of it).
    assert 1.0 < reads["answer_mib_max"] < 1.5
    out = io.StringIO()
    print_noisy_neighbour_report(result, Console(file=out, width=160))
    assert "victim" in out.getvalue()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
