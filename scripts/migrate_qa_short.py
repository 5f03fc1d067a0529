"""Give the rows of ``isouq qa short`` written before their keys had a prefix that prefix.

    .venv/bin/python scripts/migrate_qa_short.py results/qa_short

Until then a short-answer row was keyed by its TriviaQA question (``tqa-val-00051``), as the
open QA study's row of the same question is, so the two studies' rows and hand labels shared a
(dataset, model, key) and could not be reported together. Now the key is
``isouq.study.qa.short.short_key`` of it (``short-tqa-val-00051``); ``isouq qa short`` and
``isouq report`` refuse the old rows and name this script.

In FOLDER, in place (each file written atomically; a second run changes nothing):

* the short-answer rows (``label_source`` alias_match) of every ``*.jsonl`` directly in it: the
  key only, the rest of each line byte for byte;
* the hand labels under ``FOLDER/gold/`` of those rows (same dataset, model and key);
* each rows file's ``run.json``: ``dataset_sha`` recomputed over the prefixed keys, when the
  recorded one matches the dataset as it loads now (else left: the next run checks again).

The caches under ``FOLDER/cache/`` stay as they are: they are keyed by the TriviaQA key, which
seeded each question's samples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from isouq.errors import IsouqError
from isouq.evaluation.labels import is_gold_row
from isouq.runio import dumps, read_jsonl
from isouq.study.qa.runner import dataset_sha
from isouq.study.qa.short import KEY_PREFIX, is_short_row, short_key, source_key


def _rekey(path: Path, old: set[tuple[str, str, str]] | None) -> set[tuple[str, str, str]]:
    """Prefix the keys of the rows of ``path`` to migrate: short-answer rows (``old`` None) or
    hand labels of one of ``old`` ((dataset, model, TriviaQA key) of short-answer rows);
    returns the (dataset, model, old key) of the rows changed. A torn last line stays."""
    lines = path.read_text(encoding="utf-8").split("\n")
    done: set[tuple[str, str, str]] = set()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                continue
            raise SystemExit(f"{path}:{i + 1}: not JSON ({e}); nothing changed") from e
        key = str(row.get("key", ""))
        ident = (str(row.get("dataset")), str(row.get("model")), key)
        todo = is_short_row(row) if old is None else (is_gold_row(row) and ident in old)
        if not todo or key.startswith(KEY_PREFIX):
            continue
        new = line.replace(f'"key": {json.dumps(key)}', f'"key": {json.dumps(short_key(key))}', 1)
        if json.loads(new) != {**row, "key": short_key(key)}:
            raise SystemExit(f"{path}:{i + 1}: cannot rewrite the key of this line; not changed")
        lines[i] = new
        done.add(ident)
    if done:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("\n".join(lines), encoding="utf-8")
        os.replace(tmp, path)
    return done


def _run_json(path: Path) -> str | None:
    """Recompute ``dataset_sha`` of a short-answer run.json over the prefixed keys (None when
    it already is)."""
    from isouq.data.qa import load_dataset

    doc = json.loads(path.read_text(encoding="utf-8"))
    cfg = doc.get("config") or {}
    try:
        items = load_dataset(cfg["dataset"], path=cfg.get("data_path"), limit=cfg.get("limit"),
                             seed=cfg.get("seed"))
    except (IsouqError, KeyError) as e:
        return f"{path}: dataset_sha left (cannot load the dataset: {e})"
    new = dataset_sha([dataclasses.replace(it, key=short_key(it.key)) for it in items])
    if doc.get("dataset_sha") == new:
        return None
    if dataset_sha(items) != doc.get("dataset_sha"):
        return f"{path}: dataset_sha left (the dataset changed since the run)"
    doc["dataset_sha"] = new
    path.write_text(dumps(doc, indent=2), encoding="utf-8")
    return f"{path}: dataset_sha updated"


def migrate(folder: Path) -> list[str]:
    """Migrate ``folder`` (see the module); one line per file changed."""
    said: list[str] = []
    short: set[tuple[str, str, str]] = set()  # (dataset, model, TriviaQA key) of short rows
    for rows in sorted(folder.glob("*.jsonl")):
        done = _rekey(rows, None)
        if done:
            said.append(f"{rows}: {len(done)} keys prefixed")
        mine = [r for r in read_jsonl(rows) if is_short_row(r)]
        short |= {(str(r["dataset"]), str(r["model"]), source_key(r["key"])) for r in mine}
        run = rows.with_name(rows.name.removesuffix(".jsonl") + ".run.json")
        if mine and run.is_file() and (line := _run_json(run)):
            said.append(line)
    for gold in sorted((folder / "gold").glob("*.jsonl")) if short else []:
        done = _rekey(gold, short)
        if done:
            said.append(f"{gold}: {len(done)} hand labels re-keyed")
    return said


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="an `isouq qa short --out` folder")
    folder = ap.parse_args().folder
    if not folder.is_dir():
        raise SystemExit(f"{folder} is not a folder")
    print("\n".join(migrate(folder)) or f"{folder}: nothing to migrate")


if __name__ == "__main__":
    main()
