"""``joynexus bench front-channel``: both channels deliver and are timed."""

from joynexus.bench.front_channel import CHANNELS, run_front_channel_bench


def test_both_channels_round_trip_every_size() -> None:
    result = run_front_channel_bench(sizes=((8, 8), (64, 48)), messages=20)
    rows = {(r["image"], r["channel"]): r for r in result["rows"]}
    assert set(rows) == {(s, c) for s in ("8x8", "64x48") for c in CHANNELS}
    assert all(0 < r["median_us"] <= r["p99_us"] for r in rows.values())
