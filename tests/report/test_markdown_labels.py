"""Label values are data in the Markdown report: a ``model_name`` or ``pod`` holding HTML, a link, an
image, a ``|`` or a line break shows as text, in its heading, summary, table cell or list item, and
the document keeps the shape it has with plain names (same lines, same table columns).

The report is the render tests' known week (tests/report/test_render.py) with its names replaced.
"""

from __future__ import annotations

import re
from dataclasses import replace

from test_render import week_report

from sidecar.report import render
from sidecar.report.data import ModelKey

HOSTILE_MODEL = "<script>alert(1)</script>![x](http://evil.example/p.png)|col\r\nnext"
HOSTILE_POD = "pod|<img src=x onerror=alert(1)>[link](http://evil.example)\u2028*bold* _em_ `code`"
#: A pipe, bracket, angle bracket, star, backtick or underscore not preceded by a backslash.
_LIVE = re.compile(r"(?<!\\)[|<>\[\]*`]|(?<![\\A-Za-z0-9])_")


def _renamed(model_name: str, pod_prefix: str):
    report = week_report()
    models = []
    for m in report.models:
        key = ModelKey(m.model.namespace, model_name + m.model.model_name)
        pods = [replace(p, pod=pod_prefix + p.pod) for p in m.pods]
        pages = [replace(pg, model=key, pod=pod_prefix + pg.pod if pg.pod else "") for pg in m.pages]
        models.append(replace(m, model=key, pods=pods, pages=pages))
    return replace(report, models=models, summary=[m.summary for m in models if m.needs_action] or report.summary)


def _text(model_name: str, pod_prefix: str) -> str:
    return render.markdown(_renamed(model_name, pod_prefix), {}, "images")


def test_hostile_label_values_keep_the_documents_shape():
    plain, hostile = _text("m-", "p-").splitlines(), _text(HOSTILE_MODEL, HOSTILE_POD).splitlines()
    assert len(hostile) == len(plain)  # no line added by a \r, \n or U+2028
    for a, b in zip(plain, hostile, strict=True):
        if a.startswith("|"):  # a table row: the same columns
            assert len(re.findall(r"(?<!\\)\|", a)) == len(re.findall(r"(?<!\\)\|", b)), b
        assert a[:2] == b[:2]  # a heading stays a heading, an item an item, a paragraph a paragraph


def test_hostile_label_values_are_escaped_wherever_they_appear():
    text = _text(HOSTILE_MODEL, HOSTILE_POD)
    assert not re.search(r"(?<!\\)<(script|img)", text) and not re.search(r"(?<!\\)\]\(http", text)
    lines_with_names = [line for line in text.splitlines() if "alert(1)" in line]
    assert len(lines_with_names) > 5  # headings, the fleet table, pods, pages...
    for line in lines_with_names:
        body = line.strip("|") if line.startswith("|") else line
        body = re.sub(r"(?<!\\) \| ", " ", body)  # the table's own column separators
        body = re.sub(r"^(#+ |- |\d+\. )", "", body)  # the block's own markers
        body = body.removeprefix("![").split("](images/")[0] if line.startswith("![") else body
        assert not _LIVE.search(body), line


def test_the_escaper_leaves_plain_names_as_they_are():
    assert render._md_text("prod/llama-3.1-8b-instruct") == "prod/llama-3.1-8b-instruct"
    assert render._md_text("gpu_memory_utilization 0.93") == "gpu_memory_utilization 0.93"
    assert render._md_text("a\rb\nc\u2028d") == "a b c d"
    assert render._md_text("# not a heading") == "\\# not a heading"
