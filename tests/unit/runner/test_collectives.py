"""Reading flight recorder dumps: which rank is behind, in which collective. The entries
have the fields and values torch 2.13 writes (checked against real gloo dumps in
tests/integration/test_flight_recorder_dumps.py)."""

from air_sdk.runner.collectives import diagnose, format_ranks, records_of

DEFAULT = ("0", "default_pg")
TP = ("3", "tp")


def entry(seq, op="all_reduce", state="completed", group=DEFAULT, sizes=((4096,),), p2p=False):
    return {
        "record_id": seq - 1,
        "pg_id": int(group[0]),
        "process_group": group,
        "thread_name": "python",
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": 1_796_143_017_135_615_222 + seq,
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": ["BFloat16"],
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": ["BFloat16"],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": state == "completed",
        "timeout_ms": 600_000,
        "is_p2p": p2p,
    }


def dump(*entries, ranks="[0, 1, 2, 3]", groups=None):
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}
    config.update(groups or {})
    return {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": list(entries)}


def test_the_rank_that_never_entered_the_collective_is_named():
    done = [entry(s) for s in range(1, 42)]
    dumps = {r: dump(*done, entry(42, state="started")) for r in (0, 1, 2)}
    dumps[3] = dump(*done)  # rank 3 never called all_reduce #42
    d = diagnose(dumps)
    assert d.summary == (
        "rank 3 is behind in process group 0 (default_pg): ranks 0-2 wait in all_reduce #42"
        " ([4096]); rank 3 last called all_reduce #41 (completed)"
    )
    assert d.culprits == [3]
    assert d.last_collectives[3][-1] == (
        "all_reduce #41 in process group 0 (default_pg) [[4096]] BFloat16: completed"
    )
    assert len(d.last_collectives[0]) == 5


def test_a_hang_inside_a_subgroup_names_the_group_and_the_ranks():
    tp_groups = {"3": {"name": "3", "desc": "tp", "ranks": "[2, 3]"}}
    base = [entry(1), entry(2)]
    dumps = {
        0: dump(*base, groups=tp_groups),
        1: dump(*base, groups=tp_groups),
        2: dump(*base, entry(7, "reduce_scatter", "started", TP), groups=tp_groups),
        3: dump(*base, entry(6, "reduce_scatter", "completed", TP), groups=tp_groups),
    }
    d = diagnose(dumps)
    assert d.summary.startswith("rank 3 is behind in process group 3 (tp): rank 2 waits in")
    assert "rank 3 last called reduce_scatter #6 (completed)" in d.summary


def test_ranks_at_the_same_number_with_different_calls_are_a_mismatch():
    dumps = {
        0: dump(entry(1), entry(2, "all_reduce", "started"), ranks="[0, 1, 2]"),
        1: dump(entry(1), entry(2, "all_reduce", "started"), ranks="[0, 1, 2]"),
        2: dump(entry(1), entry(2, "all_gather", "started", sizes=((8,),)), ranks="[0, 1, 2]"),
    }
    d = diagnose(dumps)
    assert d.summary == (
        "collective mismatch in process group 0 (default_pg) at #2: ranks 0-1 called"
        " all_reduce ([4096]); rank 2 called all_gather ([8])"
    )
    assert d.culprits == [2]


def test_every_rank_in_the_collective_points_at_the_network():
    dumps = {r: dump(entry(1), entry(2, state="started"), ranks="[0, 1]") for r in (0, 1)}
    d = diagnose(dumps)
    assert d.summary.startswith("every rank entered all_reduce #2 in process group 0")
    assert "suspect the network or a GPU" in d.summary and d.culprits == []
    quiet = {r: dump(entry(1), ranks="[0, 1]") for r in (0, 1)}
    assert "outside collectives" in diagnose(quiet).summary


def test_a_missing_dump_is_said():
    dumps = {0: dump(entry(1), entry(2, state="started")), 1: dump(entry(1))}
    d = diagnose(dumps)  # ranks 2 and 3 are in the group but left no dump
    assert d.summary.endswith("(no dump from ranks 2-3)")
    assert d.culprits == [1]


def test_point_to_point_calls_are_listed_but_do_not_count_as_collectives():
    dumps = {
        0: dump(entry(1), entry(1, "send 0->1", "started", p2p=True), ranks="[0, 1]"),
        1: dump(entry(1), ranks="[0, 1]"),
    }
    d = diagnose(dumps)
    assert "outside collectives" in d.summary
    assert d.last_collectives[0][-1].startswith("p2p send 0->1 #1")


def test_malformed_dumps_are_read_as_far_as_they_go():
    assert diagnose({}) is None
    junk = {"entries": [None, {"profiling_name": "nccl:x"}, entry(1), "x"], "pg_config": 5}
    assert [r.seq for r in records_of(junk)] == [1]
    assert diagnose({0: junk, 1: {"entries": "nope"}}) is not None


def test_format_ranks():
    assert format_ranks([]) == ""
    assert format_ranks([3]) == "3"
    assert format_ranks([0, 1, 2, 4, 6, 7]) == "0-2, 4, 6-7"
