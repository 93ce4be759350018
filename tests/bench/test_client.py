"""The load generator's shards (bench.client): whole workers per shard, one common start, merged records."""

from __future__ import annotations

from typing import Any

import pytest

from bench import client


def spec(concurrency: int, per_worker: int) -> dict[str, Any]:
    return {"url": "u", "files": [f"f{i}" for i in range(concurrency * per_worker)], "concurrency": concurrency,
            "requests_per_worker": per_worker, "output_tokens": 1}


def test_shards_take_whole_workers_and_every_file_once() -> None:
    whole = spec(10, 3)
    shards = client.shard_specs(whole, 4, start_at=123.0)
    assert [s["concurrency"] for s in shards] == [3, 3, 2, 2]
    assert sorted(f for s in shards for f in s["files"]) == sorted(whole["files"])
    assert shards[1]["files"][:3] == ["f3", "f4", "f5"]  # worker 1's requests stay together, in order
    assert {s["start_at"] for s in shards} == {123.0} and {s["processes"] for s in shards} == {1}


@pytest.mark.parametrize("processes", [0, 11])
def test_a_shard_count_outside_one_to_the_streams_is_refused(processes: int) -> None:
    with pytest.raises(ValueError):
        client.shard_specs(spec(10, 1), processes, start_at=0.0)


def test_merged_records_get_their_unsharded_indices_and_the_wall_spans_all_shards() -> None:
    whole = spec(5, 2)
    shards = client.shard_specs(whole, 2, start_at=0.0)
    outs = []
    for n, shard in enumerate(shards):
        records = [{"index": i, "file": shard["files"][i]} for i in range(len(shard["files"]))]
        outs.append({"wall_s": 1.0 + n, "t_start": 100.0 + n, "t_end": 101.0 + 3 * n, "records": records})
    merged = client.merge_shards(whole, outs)
    assert [r["index"] for r in merged["records"]] == list(range(10))
    assert all(r["file"] == f"f{r['index']}" for r in merged["records"])  # index i is still file i
    assert merged["wall_s"] == 4.0 and merged["processes"] == 2 and merged["shard_walls_s"] == [1.0, 2.0]


def test_the_gateways_server_timing_header_is_read_per_phase() -> None:
    assert client.parse_server_timing("prepare;dur=1.5, features;dur=20.0,total;dur=412.3") == {
        "prepare": 1.5, "features": 20.0, "total": 412.3}
    assert client.parse_server_timing("") == {}
    assert client.parse_server_timing("cache, total;dur=3") == {"total": 3.0}  # a metric without a duration is skipped
