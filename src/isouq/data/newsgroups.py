"""20 Newsgroups ("bydate" split, 11,314 train / 7,532 test documents, 20 categories).

Where the documents come from, first match wins (:func:`load_newsgroups`):

1. ``path``: a folder holding ``{train,test}.jsonl.gz`` (or ``.jsonl``), or one such file;
2. ``$ISOUQ_DATA/20newsgroups/`` (or ``$ISOUQ_DATA`` itself if it holds the files);
3. the shipped copy ``<repo root>/../shared/data/20newsgroups/`` (see its SOURCE.md: the
   documents and labels of ``sklearn.datasets.fetch_20newsgroups``, in ``load_files`` order);
4. online only: ``sklearn.datasets.fetch_20newsgroups`` (downloads and caches the tarball);
5. online only: the Hugging Face dataset ``SetFit/20_newsgroups`` (needs ``datasets``).

JSONL rows: ``{"id", "split", "label", "label_name", "text"}``; labels 0–19 index the sorted
category names (sklearn's ``target``). Texts are the raw files decoded as latin-1 (headers
included); ``strip=("headers", "footers", "quotes")`` applies sklearn's own strippers.

The proxy-bias experiment (paper §3.1, App. A) groups categories by their prefix into four
topical groups (:data:`GROUPS`: ``sci``, ``comp``, ``rec``, ``talk``); ``alt.atheism``,
``misc.forsale`` and ``soc.religion.christian`` belong to none of them.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError, InputError

#: The 20 category names in label order (sklearn's ``target_names``).
CATEGORIES: tuple[str, ...] = (
    "alt.atheism", "comp.graphics", "comp.os.ms-windows.misc", "comp.sys.ibm.pc.hardware",
    "comp.sys.mac.hardware", "comp.windows.x", "misc.forsale", "rec.autos", "rec.motorcycles",
    "rec.sport.baseball", "rec.sport.hockey", "sci.crypt", "sci.electronics", "sci.med",
    "sci.space", "soc.religion.christian", "talk.politics.guns", "talk.politics.mideast",
    "talk.politics.misc", "talk.religion.misc",
)
#: The four topical groups of the proxy-bias experiment (category-name prefixes).
GROUPS: tuple[str, ...] = ("sci", "comp", "rec", "talk")
SPLITS = ("train", "test")
STRIPPABLE = ("headers", "footers", "quotes")
HF_DATASET = "SetFit/20_newsgroups"


@dataclass(frozen=True)
class Newsgroups:
    """One split of 20 Newsgroups.

    texts: N documents. labels: (N,) int64 in 0..19. ids: N document ids (``"<category>/<file>"``
    where known, else ``"<split>/<index>"``). label_names: the 20 category names.
    source: where the documents were read from (a path, ``"sklearn"`` or ``"huggingface"``).
    """

    split: str
    texts: list[str]
    labels: np.ndarray
    ids: list[str]
    label_names: tuple[str, ...]
    source: str

    def __len__(self) -> int:
        return len(self.texts)

    def groups(self) -> np.ndarray:
        """(N,) object array: each document's topical group (:data:`GROUPS`) or ``""``."""
        return np.array([group_of(self.label_names[int(c)]) for c in self.labels], dtype=object)

    def subset(self, index: Sequence[int] | np.ndarray) -> Newsgroups:
        """The documents at positions ``index`` (in that order)."""
        idx = np.asarray(index, dtype=np.int64)
        return Newsgroups(self.split, [self.texts[i] for i in idx], self.labels[idx],
                          [self.ids[i] for i in idx], self.label_names, self.source)


def group_of(category: str) -> str:
    """The topical group of a category name (``"sci.med"`` → ``"sci"``), ``""`` if none."""
    prefix = category.split(".", 1)[0]
    return prefix if prefix in GROUPS else ""


def group_labels(group: str, label_names: Sequence[str] = CATEGORIES) -> list[int]:
    """Labels (indices into ``label_names``) of the categories in ``group``."""
    if group not in GROUPS:
        raise InputError(f"unknown group {group!r}; use one of {', '.join(GROUPS)}")
    return [i for i, n in enumerate(label_names) if group_of(n) == group]


# --------------------------------------------------------------------------- locating files


def repo_root(start: Path | None = None) -> Path | None:
    """The nearest folder above ``start`` (default: this file) holding ``pyproject.toml``."""
    here = (start or Path(__file__)).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file():
            return d
    return None


def _split_file(folder: Path, split: str) -> Path | None:
    for name in (f"{split}.jsonl.gz", f"{split}.jsonl"):
        if (folder / name).is_file():
            return folder / name
    return None


def candidate_dirs(path: str | os.PathLike | None = None) -> list[Path]:
    """Folders searched for ``{split}.jsonl.gz``, in order (user path, $ISOUQ_DATA, shipped)."""
    dirs: list[Path] = []
    if path is not None:
        p = Path(path).expanduser()
        dirs.append(p.parent if p.is_file() else p)
    env = os.environ.get("ISOUQ_DATA")
    if env:
        dirs += [Path(env).expanduser() / "20newsgroups", Path(env).expanduser()]
    root = repo_root()
    if root is not None:
        dirs.append(root.parent / "shared" / "data" / "20newsgroups")
    return dirs


def find_local(split: str, path: str | os.PathLike | None = None) -> Path | None:
    """The local JSONL file for ``split``, or None. A ``path`` that is a file is used as is."""
    if path is not None and Path(path).expanduser().is_file():
        return Path(path).expanduser()
    for d in candidate_dirs(path):
        f = _split_file(d, split)
        if f is not None:
            return f
    return None


# --------------------------------------------------------------------------- readers


def read_jsonl(file: Path, split: str) -> Newsgroups:
    """Read a ``{split}.jsonl(.gz)`` file in the shipped format (see the module docstring)."""
    opener = gzip.open if file.suffix == ".gz" else open
    texts, labels, ids = [], [], []
    try:
        with opener(file, "rt", encoding="utf-8") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                row = json.loads(line)
                texts.append(row["text"])
                labels.append(int(row["label"]))
                ids.append(str(row.get("id", f"{split}/{i}")))
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise DataError(
            f"{file} is not a 20 Newsgroups JSONL file ({type(e).__name__}: {e}); each line "
            "needs 'text' and 'label' (see the SOURCE.md beside the shipped 20newsgroups data)"
        ) from e
    if not texts:
        raise DataError(f"{file} holds no documents")
    return Newsgroups(split, texts, np.asarray(labels, dtype=np.int64), ids, CATEGORIES,
                      str(file))


def _from_sklearn(split: str) -> Newsgroups:
    from sklearn.datasets import fetch_20newsgroups  # lazy: network on first use

    bunch = fetch_20newsgroups(subset=split, shuffle=False, download_if_missing=True)
    ids = [f"{Path(f).parent.name}/{Path(f).name}" for f in bunch.filenames]
    return Newsgroups(split, list(bunch.data), np.asarray(bunch.target, dtype=np.int64), ids,
                      tuple(bunch.target_names), "sklearn")


def _from_huggingface(split: str) -> Newsgroups:
    from datasets import load_dataset  # lazy: optional dependency, network on first use

    ds = load_dataset(HF_DATASET, split=split)
    names = tuple(CATEGORIES)
    return Newsgroups(split, list(ds["text"]), np.asarray(ds["label"], dtype=np.int64),
                      [f"{split}/{i}" for i in range(len(ds))], names, "huggingface")


def strip_texts(texts: list[str], parts: Sequence[str]) -> list[str]:
    """Apply sklearn's header/footer/quote strippers (``parts`` ⊆ :data:`STRIPPABLE`)."""
    bad = [p for p in parts if p not in STRIPPABLE]
    if bad:
        raise InputError(f"cannot strip {bad}; choose from {', '.join(STRIPPABLE)}")
    if not parts:
        return texts
    from sklearn.datasets._twenty_newsgroups import (
        strip_newsgroup_footer,
        strip_newsgroup_header,
        strip_newsgroup_quoting,
    )

    fns = {"headers": strip_newsgroup_header, "footers": strip_newsgroup_footer,
           "quotes": strip_newsgroup_quoting}
    out = []
    for t in texts:
        for p in STRIPPABLE:
            if p in parts:
                t = fns[p](t)
        out.append(t)
    return out


def load_newsgroups(
    split: str = "train",
    *,
    path: str | os.PathLike | None = None,
    online: bool = True,
    strip: Sequence[str] = (),
) -> Newsgroups:
    """Load one split of 20 Newsgroups from the first source that has it (module docstring).

    split: ``"train"`` or ``"test"``. path: a folder with ``{split}.jsonl.gz`` or a file.
    online: also try sklearn's downloader and the Hugging Face hub when no local copy exists.
    strip: any of ``"headers", "footers", "quotes"`` (sklearn's ``remove=``).
    """
    if split not in SPLITS:
        raise InputError(f"split={split!r}; use 'train' or 'test'")
    if path is not None and not Path(path).expanduser().exists():
        raise DataError(f"20 Newsgroups path {path} does not exist; pass a folder holding "
                        f"{split}.jsonl.gz, or leave it out to use the shipped copy")
    file = find_local(split, path)
    errors: list[str] = []
    if file is not None:
        data = read_jsonl(file, split)
    else:
        data = None
        for name, fn in (("sklearn", _from_sklearn), ("huggingface", _from_huggingface)):
            if not online:
                break
            try:
                data = fn(split)
                break
            except Exception as e:  # noqa: BLE001 - offline, missing package, ...
                errors.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        if data is None:
            searched = ", ".join(str(d) for d in candidate_dirs(path))
            raise DataError(
                f"20 Newsgroups ({split}) not found. Searched {searched} for {split}.jsonl.gz"
                + (f"; downloads failed ({'; '.join(errors)})" if errors else "")
                + ". Pass path=<folder with train/test.jsonl.gz>, set ISOUQ_DATA, or go online "
                "(sklearn's fetch_20newsgroups)"
            )
    if strip:
        data = Newsgroups(data.split, strip_texts(data.texts, strip), data.labels, data.ids,
                          data.label_names, data.source)
    return data
