"""Synthetic QA rows for the evaluation tests."""

from __future__ import annotations

import pytest

from qa_rows import synth_rows


@pytest.fixture
def rows() -> list[dict]:
    return synth_rows()
