"""Fault-tolerance pieces without Ray workers: the per-action timeout, what the driver keeps to restore a
restarted generator, the streamed timeline, and the driver's moving window over the records."""

import json

import pytest

from verl_digen.config import compose
from verl_digen.driver.faults import FaultPolicy, GeneratorState, fault_policy
from verl_digen.reporting.progress import Recent
from verl_digen.reporting.trace_stream import RecordStream, read_stream
from verl_digen.schedule.timeline import Record, record_dict


def test_action_timeout_is_the_factor_times_the_estimate_with_a_floor():
    p = FaultPolicy(max_restarts=1, timeout_factor=10.0, timeout_min_s=30.0)
    assert p.timeout(5.0) == 50.0
    assert p.timeout(2.0) == 30.0  # the floor
    assert p.timeout(0.0) == 30.0 and p.timeout(float("nan")) == 30.0  # no estimate yet
    assert FaultPolicy(timeout_factor=None).timeout(1e9) is None


def test_restarts_need_the_object_store_sync():
    assert fault_policy(compose(["trainer.generator_max_restarts=2"])).max_restarts == 2
    collective = compose(["trainer.generator_max_restarts=2", "digen.sync.backend=collective"])
    assert fault_policy(collective).max_restarts == 0


def test_generator_state_keeps_the_weights_a_generator_may_need_back():
    st = GeneratorState(held=[0, 0])
    for v in (1, 2):
        st.published(v, f"ref{v}")
    st.picked_up(0, 1)
    assert set(st.weights) == {1, 2}  # gen1 still holds 0 (built by init_model, never stored)
    st.picked_up(1, 2)
    assert set(st.weights) == {1, 2}  # gen0 holds 1: a restart of gen0 reloads it
    st.picked_up(0, 2)
    assert set(st.weights) == {2}


def test_restore_refuses_a_version_whose_weights_are_gone():
    class Gen:
        class _M:
            def __init__(self, name, calls):
                self.name, self.calls = name, calls

            def remote(self, *args):
                self.calls.append((self.name, args))
                return self.name

        def __init__(self):
            self.calls = []
            self.init_model, self.load_weights = self._M("init", self.calls), self._M("load", self.calls)

    st = GeneratorState(held=[2])
    st.published(2, "w2")
    gen = Gen()
    assert st.restore(gen, 0) == ["init", "load"] and gen.calls == [("init", ()), ("load", (2, "w2"))]
    st.held[0] = 5
    with pytest.raises(RuntimeError, match="version 5"):
        st.restore(Gen(), 0)


def _rec(i: int, end: float) -> Record:
    return Record("gen0", "generate", i, i, i, end - 1.0, end, issued=end - 0.75)


def test_record_stream_appends_only_new_records_and_reads_back_a_torn_file(tmp_path):
    records = [_rec(0, 1.0)]
    path = tmp_path / "t.jsonl"
    s = RecordStream(path, records, {"run_id": "r1"})
    assert s.flush() == 0  # records before the stream began are not its to write
    records += [_rec(1, 2.0), _rec(2, 3.0)]
    assert s.flush() == 2 and s.flush() == 0
    records.append(_rec(3, 4.0))
    s.close()
    s.close()
    with path.open("a") as f:
        f.write('{"worker": "gen0", "ki')  # a writer killed mid-line
    header, got = read_stream(path)
    assert header == {"run_id": "r1"} and [r["mb"] for r in got] == [1, 2, 3]
    assert got[0] == json.loads(json.dumps(record_dict(records[1])))


def test_a_resumed_run_appends_to_the_stream_after_the_steps_its_checkpoint_holds(tmp_path):
    from verl_digen.schedule.export import read_runs, timeline_from_file

    path = tmp_path / "digen_timeline.jsonl"
    first = RecordStream(path, [], {"run_id": "a", "first_step": 0})
    first.records.extend(_rec(i, i + 1.0) for i in range(4))  # steps 0..3; the run died after step 3 began
    first.close()
    resumed = RecordStream(path, [], {"run_id": "b", "first_step": 2}, keep_through=2)  # checkpoint of step 2
    resumed.records.extend(_rec(i, i + 1.0) for i in range(2))  # its local steps 0, 1 are global 2, 3
    resumed.close()
    (a, kept), (b, new) = read_runs(path)
    assert (a["run_id"], [r["step"] for r in kept]) == ("a", [0, 1])  # what step 2 onwards did is redone
    assert (b["run_id"], [r["step"] for r in new]) == ("b", [0, 1])
    assert read_stream(path) == (b, new)  # the last run
    joined = timeline_from_file(path)  # one history: global steps, the second run after the first
    assert [(r.step, r.version) for r in joined.records] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert [r.end for r in joined.records] == [1.0, 2.0, 3.0, 4.0]
    assert [r.dispatch for r in joined.records] == [0.25] * 4  # each run's issue times moved with its clock
    fresh = RecordStream(path, [], {"run_id": "c"})  # a fresh run starts the file over
    fresh.close()
    assert [h["run_id"] for h, _ in read_runs(path)] == ["c"]


def test_recent_window_moves_for_good_and_checks_each_item_about_once():
    items = [_rec(i, float(i)) for i in range(10)]
    w = Recent(items)
    calls = []

    def keep(r, lo):
        calls.append(r.mb)
        return r.end >= lo

    assert [r.mb for r in w.since(lambda r: keep(r, 3.0))] == list(range(3, 10))
    items.append(_rec(10, 10.0))
    calls.clear()
    assert [r.mb for r in w.since(lambda r: keep(r, 0.0))] == list(range(3, 11))  # never moves back
    assert calls == [3]  # one check, not a rescan of the history
    calls.clear()
    assert [r.mb for r in w.since(lambda r: keep(r, 9.0))] == [9, 10] and calls == [3, 4, 5, 6, 7, 8, 9]
