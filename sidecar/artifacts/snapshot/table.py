"""A table panel's rows as Grafana's table shows them, from instant query results.

Grafana turns each query's result into a frame (``Time``, one field per label, ``Value``), then
applies the panel's transformations in order. The ones our dashboards use are implemented:
``merge`` (join the frames on shared labels), ``convertFieldType`` (a label to a number),
``filterFieldsByName`` and ``organize`` (hide, order, rename); then ``sortBy`` and each column's
unit and value mappings. :func:`table_rows` gives the headers and cell texts; drawing is elsewhere.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from .data import PanelData
from .fields import field_defaults, mapped_text, override
from .units import format_value, utc


def _transformation(panel: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The options of the panel's first transformation ``kind`` (``merge``, ``organize``, ...), else None."""
    for t in panel.get("transformations") or []:
        if t.get("id") == kind and not t.get("disabled"):
            return t.get("options") or {}
    return None


def _table_records(panel: Mapping[str, Any], data: PanelData) -> list[dict[str, Any]]:
    """One record per row as Grafana's table builds it from instant results in table format.

    Each query is a frame of rows ``Time``, its labels, and ``Value`` (``Value #<refId>`` when the
    panel has several queries). The ``merge`` transformation joins the frames' rows on the labels
    they share; without it the table shows the first query's frame.
    """
    refs = [t.get("refId", "") for t in panel.get("targets", []) if t.get("expr") and not t.get("hide")]
    merge = _transformation(panel, "merge") is not None
    records: list[dict[str, Any]] = []
    for s in data.series:
        if not merge and refs and s.ref_id != refs[0]:
            continue
        labels = {k: v for k, v in s.labels.items() if k != "__name__"}
        value_field = f"Value #{s.ref_id}" if len(refs) > 1 else "Value"
        record = {"Time": s.times[-1] if s.times else None, **labels, value_field: s.last()}
        into = next((r for r in records if merge and _joins(r, labels, value_field)), None)
        if into is None:
            records.append(record)
        else:
            into.update(record)
    return _to_numbers(panel, records)


def _to_numbers(panel: Mapping[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Grafana's ``convertFieldType`` to ``number``: a label such as ``gpu_memory_utilization="0.9"`` becomes
    0.9, so the column's unit applies; a text that is no number becomes empty (Grafana: null)."""
    conversions = (_transformation(panel, "convertFieldType") or {}).get("conversions") or []
    for conversion in conversions:
        name = conversion.get("targetField")
        if conversion.get("destinationType") != "number" or not name:
            continue
        for record in records:
            value = record.get(name)
            if isinstance(value, str):
                try:
                    record[name] = float(value)
                except ValueError:
                    record[name] = None
    return records


def _joins(row: Mapping[str, Any], labels: Mapping[str, str], value_field: str) -> bool:
    shared = [k for k in labels if k in row]
    return value_field not in row and bool(shared) and all(row[k] == labels[k] for k in shared)


def _table_fields(panel: Mapping[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """The fields shown, in order: Time, the labels (sorted), the values; then ``filterFieldsByName``
    and ``organize`` (exclude, order)."""
    seen = {k for r in records for k in r}
    values = sorted(k for k in seen if k == "Value" or k.startswith("Value #"))
    fields = [*(["Time"] if "Time" in seen else []), *sorted(seen - {"Time", *values}), *values]
    keep = _transformation(panel, "filterFieldsByName")
    if keep is not None:
        include = (keep.get("include") or {}).get("names")
        pattern = (keep.get("include") or {}).get("pattern")
        exclude = set((keep.get("exclude") or {}).get("names") or [])
        fields = [
            f
            for f in fields
            if (include is None or f in include) and (pattern is None or re.fullmatch(pattern, f)) and f not in exclude
        ]
    organize = _transformation(panel, "organize") or {}
    hidden = organize.get("excludeByName") or {}
    order = organize.get("indexByName") or {}
    fields = [f for f in fields if not hidden.get(f)]
    return sorted(fields, key=lambda f: order.get(f, 1000 + fields.index(f)))


def _cell(panel: Mapping[str, Any], field_name: str, shown_name: str, v: Any) -> str:
    if field_name == "Time" and isinstance(v, float):
        return utc(v)
    mappings = override(panel, "mappings", shown_name) or override(panel, "mappings", field_name)
    mappings = mappings or field_defaults(panel).get("mappings")
    if isinstance(v, float):
        unit = (
            override(panel, "unit", shown_name)
            or override(panel, "unit", field_name)
            or field_defaults(panel).get("unit")
        )
        return mapped_text(mappings, v) or format_value(v, unit, field_defaults(panel).get("decimals"))
    if isinstance(v, str):
        return mapped_text(mappings, v) or v
    return ""


def table_rows(panel: Mapping[str, Any], data: PanelData) -> tuple[list[str], list[list[str]]]:
    """Column headers and cell texts as Grafana's table shows the panel's instant results: frames per
    query (joined by ``merge``), fields picked by ``filterFieldsByName``, ordered and renamed by
    ``organize``, sorted by the panel's ``sortBy``, values in the unit of the column's override."""
    records = _table_records(panel, data)
    fields = _table_fields(panel, records)
    rename = (_transformation(panel, "organize") or {}).get("renameByName") or {}
    shown = [rename.get(f) or f for f in fields]
    for sort in reversed((panel.get("options") or {}).get("sortBy") or []):
        if sort.get("displayName") in shown:
            _sort_by(records, fields[shown.index(sort["displayName"])], bool(sort.get("desc")))
    rows = [[_cell(panel, f, n, r.get(f)) for f, n in zip(fields, shown, strict=True)] for r in records]
    return shown, rows


def _sort_by(records: list[dict[str, Any]], field_name: str, desc: bool) -> None:
    """Sort in place by one field: numbers by value, after (or, descending, before) the rest."""

    def key(record: Mapping[str, Any]) -> tuple[int, float, str]:
        v = record.get(field_name)
        if isinstance(v, float) and not math.isnan(v):
            return (1, v, "")
        return (0, 0.0, "" if v is None else str(v))

    records.sort(key=key, reverse=desc)
