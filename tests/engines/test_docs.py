"""docs/engines.md's gauge table says "no" exactly where each adapter always says absent.

A cell that starts with "no" means "never, on any page of this engine"; the adapter's ``ABSENT`` table
holds the gauges it names absent on every page. Conditional absences (an older build, a Triton page, a
missing ``targets[].capacity_tokens``) are written otherwise ("older builds only", "with ...").
"""

from __future__ import annotations

import re
from types import ModuleType

import pytest
from fixtures import REPO

from sidecar.engines import llamacpp, sglang, tgi, trtllm

DOC = REPO / "docs" / "engines.md"
#: The gauge table's column header of each engine.
COLUMNS: dict[str, ModuleType] = {"SGLang": sglang, "TensorRT-LLM": trtllm, "TGI": tgi, "llama.cpp": llamacpp}


def gauge_table() -> tuple[list[str], list[list[str]]]:
    """The header and the rows of the table whose first column is ``gauge``."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| gauge |"))
    header = [c.strip() for c in lines[start].split("|")[1:-1]]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.split("|")[1:-1]])
    return header, rows


@pytest.mark.parametrize("column", sorted(COLUMNS))
def test_the_engines_doc_says_no_exactly_where_the_adapter_says_absent(column: str) -> None:
    header, rows = gauge_table()
    at = header.index(column)
    assert all(len(cells) == len(header) for cells in rows), "a row with a missing cell"
    said_no = {
        name for cells in rows if cells[at].startswith("no") for name in re.findall(r"`(kvcache_\w+)`", cells[0])
    }
    assert said_no == set(COLUMNS[column].ABSENT)
