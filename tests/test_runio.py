"""runio: crash-safe JSONL rows and results.json."""

import gzip
import json

import pytest

from isouq.errors import DataError, InputError
from isouq.runio import JsonlWriter, machine_label, read_jsonl, update_tables, write_results


def test_torn_tail_skipped_complete_tail_kept(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text('{"key": 1}\n{"key": 2}\n{"key": 3, "x"')
    assert [r["key"] for r in read_jsonl(p)] == [1, 2]
    p.write_text('{"key": 1}\n{"key": 2}')  # a user's file without a final newline
    assert [r["key"] for r in read_jsonl(p)] == [1, 2]
    g = tmp_path / "rows.jsonl.gz"
    with gzip.open(g, "wt") as f:
        f.write('{"key": "a"}\n')
    assert read_jsonl(g) == [{"key": "a"}]
    p.write_text('{"key": 1}\nnot json\n{"key": 2}\n')
    with pytest.raises(DataError, match=":2 is not valid JSON"):
        read_jsonl(p)


def test_writer_repairs_torn_tail_and_skips_done_keys(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text('{"key": "a", "v": 1}\n{"key": "b", "v"')
    w = JsonlWriter(p)
    assert w.done("a") and not w.done("b")
    w.write({"key": "b", "v": 2})
    assert read_jsonl(p) == [{"key": "a", "v": 1}, {"key": "b", "v": 2}]
    assert p.read_text().count("\n") == 2


def test_write_results(tmp_path):
    import time

    path = write_results(tmp_path, "demo", settings={"n": 1}, seed=0, started=time.time(),
                         tables={"t": [{"a": 1.0, "b": "x"}]}, paper={"t": [{"a": 2.0}]})
    doc = json.loads(path.read_text())
    assert doc["experiment"] == "demo" and doc["tables"]["t"][0]["a"] == 1.0
    assert "torch" in doc["versions"]
    md = (tmp_path / "tables.md").read_text()
    assert "| a | b |" in md and "Paper:" in md


def test_update_tables_replaces_adds_and_removes_only_the_named(tmp_path):
    import time

    with pytest.raises(InputError, match="run the experiment there first"):
        update_tables(tmp_path, {"t": [{"a": 1}]})
    write_results(tmp_path, "demo", settings={"n": 1}, seed=0, started=time.time(),
                  tables={"t": [{"a": 1.0}], "u": [{"c": 3}]}, extra={"rows": 7})
    update_tables(tmp_path, {"t": [{"a": 5.0}], "new": [{"z": "q"}], "u": []})
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["tables"] == {"t": [{"a": 5.0}], "new": [{"z": "q"}]}
    assert doc["rows"] == 7 and doc["settings"] == {"n": 1}
    md = (tmp_path / "tables.md").read_text()
    assert "## new" in md and "| 5 |" in md and "## u" not in md


def test_tune_allocator_is_optional(monkeypatch):
    from isouq.runtime import tune_allocator

    monkeypatch.setenv("ISOUQ_MALLOC_TUNING", "0")
    assert tune_allocator() is False
    monkeypatch.delenv("ISOUQ_MALLOC_TUNING")
    assert isinstance(tune_allocator(), bool)  # True on glibc, False elsewhere


def test_write_ordered_one_row_per_key_highest_revision_wins(tmp_path):
    from isouq.distributed import write_ordered

    rows = [{"key": "b", "v": 1}, {"key": "a", "v": 1}, {"key": "a", "v": 1},
            {"key": "b", "v": 2, "revision": 1}, {"key": "b", "v": 0}]
    out = write_ordered(tmp_path / "o.jsonl", rows, ["a", "b"])
    assert read_jsonl(out) == [{"key": "a", "v": 1}, {"key": "b", "v": 2, "revision": 1}]
    with pytest.raises(DataError, match="appears twice"):
        write_ordered(tmp_path / "o.jsonl", [{"key": "a", "v": 1}, {"key": "a", "v": 2}], ["a"])
    with pytest.raises(DataError, match="not scored yet"):
        write_ordered(tmp_path / "o.jsonl", rows, ["a", "b", "c"])
    # keys outside this run's (a larger earlier run) are kept after, never dropped
    extra = [{"key": "z", "v": 9}, *rows, {"key": "y", "v": 8}]
    out = write_ordered(tmp_path / "o.jsonl", extra, ["b"])
    assert [r["key"] for r in read_jsonl(out)] == ["b", "z", "a", "y"]


def test_exclusive_lets_one_writer_in_at_a_time(tmp_path):
    from isouq.errors import InputError
    from isouq.runio import exclusive

    out = tmp_path / "rows.jsonl"
    with exclusive(out):
        with pytest.raises(InputError, match="another process is writing"):
            with exclusive(out):
                pass
    with exclusive(out):  # released on exit
        pass


def test_latest_by_key_keeps_the_newest_revision_in_first_seen_order():
    from isouq.runio import latest_by_key

    rows = [{"key": "b", "v": 0}, {"key": "a", "v": 0}, {"key": "b", "v": 1, "revision": 1},
            {"key": "b", "v": 2}, {"note": "no key"}, {"key": "a", "v": 3, "revision": 2}]
    assert latest_by_key(rows) == [{"key": "b", "v": 1, "revision": 1},
                                   {"key": "a", "v": 3, "revision": 2}, {"note": "no key"}]
    same_key_two_models = [{"key": "q", "model": "m1"}, {"key": "q", "model": "m2"}]
    assert latest_by_key(same_key_two_models, ("model", "key")) == same_key_two_models


def test_machine_label_names_what_changes_timings():
    import torch

    before = torch.get_num_threads()
    label = machine_label()
    assert label == machine_label() and f"{before} threads, cpu" in label
    try:
        torch.set_num_threads(before + 1)
        assert machine_label() != label  # other threads: timings no longer compare
    finally:
        torch.set_num_threads(before)
