"""``kv-sidecar dashboards push`` against a recording stand-in for Grafana's HTTP API.

No Grafana can run here, so ``grafana_stub.GrafanaStub`` answers as Grafana 11 does (its bodies and
status codes, from Grafana's docs and source) and records what grafana-client sent. The tests drive the
real command line (``sidecar.cli.main``) with the committed ``dashboards/*.json`` and check: what is
created, updated or left alone (including dashboards Grafana provisions from files, which it refuses
to save); that every save carries ``overwrite`` and the folder uid; the ``Authorization`` header; that
``--dry-run`` writes nothing; and that each way Grafana can refuse or fail ends in one line naming the
reason, with the token never printed.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures import REPO
from grafana_stub import CREATE_FOLDER, GET_DASHBOARD, GET_FOLDER, SAVE_DASHBOARD, GrafanaStub

from sidecar.artifacts.grafana import meaningful
from sidecar.artifacts.params import DASHBOARD_UIDS
from sidecar.cli import main

COMMITTED = REPO / "dashboards"
#: A token shaped like a Grafana service-account token, unique so that a leak cannot hide.
TOKEN = f"glsa_{secrets.token_hex(16)}_{secrets.token_hex(4)}"
PREFIX = "kv-sidecar dashboards push: "


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    @property
    def reason(self) -> str:
        """The one line a failure prints (the test fails when there are more, or none)."""
        lines = self.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(PREFIX), self.err
        return lines[0].removeprefix(PREFIX)


@pytest.fixture
def stub():
    s = GrafanaStub(token=TOKEN)
    yield s
    s.stop()


@pytest.fixture
def push(capsys, monkeypatch):
    """Run ``kv-sidecar dashboards push --grafana-url <url> ARGS`` with GRAFANA_TOKEN set (or ``env_token``)."""

    def run(url: str, *args: str, env_token: str | None = TOKEN) -> Run:
        if env_token is None:
            monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
        else:
            monkeypatch.setenv("GRAFANA_TOKEN", env_token)
        capsys.readouterr()
        code = main(["dashboards", "push", "--grafana-url", url, *args])
        out, err = capsys.readouterr()
        assert TOKEN not in out + err, "the token was printed"
        return Run(code, out, err)

    return run


def committed_dashboards() -> list[dict]:
    files = sorted(COMMITTED.glob("*.json"))
    docs = [json.loads(f.read_text(encoding="utf-8")) for f in files]
    assert sorted(d["uid"] for d in docs) == sorted(DASHBOARD_UIDS), f"{COMMITTED}/*.json: expected {DASHBOARD_UIDS}"
    return docs


@pytest.fixture
def editable(tmp_path) -> Path:
    """A copy of the committed dashboards that a test may change."""
    out = tmp_path / "dashboards"
    out.mkdir()
    for f in COMMITTED.glob("*.json"):
        shutil.copy(f, out / f.name)
    return out


def saves(stub: GrafanaStub) -> list[dict]:
    return [r.body for r in stub.requests if r.route == SAVE_DASHBOARD]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


# --- what a push does ---------------------------------------------------------------------------------


def test_first_push_creates_the_folder_and_every_committed_dashboard(stub, push):
    dashboards = committed_dashboards()
    run = push(stub.url, "--dashboards", str(COMMITTED))

    assert run.code == 0, run.err
    assert run.lines == ["folder kvcache: created"] + [f"{uid}: created" for uid in sorted(DASHBOARD_UIDS)]
    assert stub.state.folders["kvcache"]["title"] == "KV cache"
    for doc in dashboards:
        stored = stub.dashboard(doc["uid"])
        assert stored["folderUid"] == "kvcache"
        assert meaningful(stored["dashboard"]) == meaningful(doc)
    # grafana-client's paths, in order: the folder, then per dashboard a read and a save
    expected = ["GET /api/folders/kvcache", "POST /api/folders"]
    for uid in sorted(DASHBOARD_UIDS):
        expected += [f"GET /api/dashboards/uid/{uid}", "POST /api/dashboards/db"]
    assert [f"{r.method} {r.path}" for r in stub.requests] == expected
    assert stub.requests[1].body == {"title": "KV cache", "uid": "kvcache"}


def test_every_save_overwrites_by_uid_in_the_folder(stub, push, editable):
    push(stub.url, "--dashboards", str(COMMITTED))
    path = editable / "kvcache-pod.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "title": doc["title"] + " (edited)"}))
    push(stub.url, "--dashboards", str(editable))

    bodies = saves(stub)
    assert len(bodies) == 4
    for body in bodies:
        assert body["overwrite"] is True
        assert body["folderUid"] == "kvcache"  # without it Grafana moves the dashboard to General
        assert body["dashboard"]["id"] is None  # the uid names it, whatever its id in this Grafana


def test_every_request_carries_the_bearer_token(stub, push):
    push(stub.url, "--dashboards", str(COMMITTED))
    assert stub.requests
    assert {r.headers.get("Authorization") for r in stub.requests} == {f"Bearer {TOKEN}"}


def test_second_push_is_unchanged_and_writes_nothing(stub, push):
    push(stub.url, "--dashboards", str(COMMITTED))
    before = len(stub.requests)
    run = push(stub.url, "--dashboards", str(COMMITTED))

    assert run.code == 0, run.err
    assert run.lines == ["folder kvcache: exists"] + [f"{uid}: unchanged" for uid in sorted(DASHBOARD_UIDS)]
    assert [r.method for r in stub.requests[before:]] == ["GET"] * 4
    assert all(stub.dashboard(uid)["dashboard"]["version"] == 1 for uid in DASHBOARD_UIDS)


def test_a_changed_dashboard_is_updated_and_only_it(stub, push, editable):
    push(stub.url, "--dashboards", str(editable))
    path = editable / "kvcache-capacity.json"
    doc = json.loads(path.read_text())
    doc["description"] = "changed by the test"
    path.write_text(json.dumps(doc))
    before = len(stub.requests)
    run = push(stub.url, "--dashboards", str(editable))

    assert run.code == 0, run.err
    assert "kvcache-capacity: updated" in run.lines
    assert "kvcache-overview: unchanged" in run.lines and "kvcache-pod: unchanged" in run.lines
    writes = [r for r in stub.requests[before:] if r.method == "POST"]
    assert [w.body["dashboard"]["uid"] for w in writes] == ["kvcache-capacity"]
    assert stub.dashboard("kvcache-capacity")["dashboard"]["version"] == 2


def test_a_dashboard_in_another_folder_is_moved_into_ours(stub, push):
    overview = next(d for d in committed_dashboards() if d["uid"] == "kvcache-overview")
    stub.add_dashboard(dict(overview), folder_uid="")  # same content, in General
    run = push(stub.url, "--dashboards", str(COMMITTED))

    assert "kvcache-overview: updated" in run.lines
    assert stub.dashboard("kvcache-overview")["folderUid"] == "kvcache"


def test_an_existing_folder_is_kept_as_it_is(stub, push):
    stub.add_folder("kvcache", "Renamed by an admin")
    run = push(stub.url, "--dashboards", str(COMMITTED), "--folder", "KV cache")

    assert run.lines[0] == "folder kvcache: exists"
    assert not [r for r in stub.requests if r.route == CREATE_FOLDER]
    assert stub.state.folders["kvcache"]["title"] == "Renamed by an admin"


def test_folder_title_and_uid_flags(stub, push):
    run = push(stub.url, "--dashboards", str(COMMITTED), "--folder", "Inference", "--folder-uid", "llm-serving")

    assert run.code == 0, run.err
    assert stub.state.folders["llm-serving"]["title"] == "Inference"
    assert {body["folderUid"] for body in saves(stub)} == {"llm-serving"}


def test_dry_run_reports_and_sends_no_write(stub, push, editable):
    run = push(stub.url, "--dashboards", str(editable), "--dry-run")
    assert run.code == 0, run.err
    assert run.lines == ["folder kvcache: would be created"] + [
        f"{uid}: would be created" for uid in sorted(DASHBOARD_UIDS)
    ]
    assert stub.writes() == []

    push(stub.url, "--dashboards", str(editable))
    path = editable / "kvcache-pod.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "description": "edited, not pushed"}))
    writes = len(stub.writes())
    run = push(stub.url, "--dashboards", str(editable), "--dry-run")
    assert "kvcache-pod: would be updated" in run.lines and "kvcache-overview: unchanged" in run.lines
    assert len(stub.writes()) == writes
    assert stub.dashboard("kvcache-pod")["dashboard"].get("description") != "edited, not pushed"


def provision(stub: GrafanaStub, docs: list[dict], *, allow_ui_updates: bool = False) -> None:
    """Load ``docs`` into ``stub`` as Grafana's file provider does: into the folder, marked provisioned."""
    stub.add_folder("kvcache", "KV cache")
    for doc in docs:
        stub.add_dashboard(
            dict(doc), "kvcache", provisioned_from=f"{doc['uid']}.json", allow_ui_updates=allow_ui_updates
        )


def stub_get(stub: GrafanaStub, uid: str) -> dict:
    """The stub's answer to ``GET /api/dashboards/uid/<uid>`` (what the command reads)."""
    request = urllib.request.Request(
        f"{stub.url}/api/dashboards/uid/{uid}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.load(answer)


def with_description(doc: dict, text: str) -> dict:
    return {**doc, "description": text}


def test_a_dashboard_provisioned_from_files_is_kept_and_never_saved(stub, push):
    docs = committed_dashboards()
    older = [with_description(d, "an older file") if d["uid"] == "kvcache-pod" else d for d in docs]
    provision(stub, older)
    meta = stub_get(stub, "kvcache-pod")["meta"]
    assert (meta["provisioned"], meta["provisionedExternalId"]) == (True, "kvcache-pod.json")  # Grafana's meta

    for args in ([], ["--dry-run"]):
        run = push(stub.url, "--dashboards", str(COMMITTED), *args)
        assert run.code == 0, run.err
        assert run.lines == [
            "folder kvcache: exists",
            "kvcache-capacity: unchanged",  # equal content: unchanged, provisioned or not
            "kvcache-overview: unchanged",
            "kvcache-pod: provisioned (kept; Grafana serves it from files)",
        ]
    assert stub.writes() == []
    assert stub.dashboard("kvcache-pod")["dashboard"]["description"] == "an older file"


def test_a_provisioned_dashboard_in_another_folder_is_kept_too(stub, push):
    overview = next(d for d in committed_dashboards() if d["uid"] == "kvcache-overview")
    stub.add_dashboard(dict(overview), "", provisioned_from="kvcache-overview.json")  # another provider, General
    run = push(stub.url, "--dashboards", str(COMMITTED))
    assert run.code == 0, run.err
    assert "kvcache-overview: provisioned (kept; Grafana serves it from files)" in run.lines
    assert [b["dashboard"]["uid"] for b in saves(stub)] == ["kvcache-capacity", "kvcache-pod"]
    assert stub.dashboard("kvcache-overview")["folderUid"] == ""


def test_a_provider_allowing_ui_updates_lets_the_push_save(stub, push):
    docs = committed_dashboards()
    provision(stub, [with_description(d, "an older file") for d in docs], allow_ui_updates=True)
    assert stub_get(stub, "kvcache-pod")["meta"]["provisioned"] is False  # what Grafana answers then
    run = push(stub.url, "--dashboards", str(COMMITTED))
    assert run.code == 0, run.err
    assert run.lines[1:] == [f"{uid}: updated" for uid in sorted(DASHBOARD_UIDS)]
    assert all(stub.dashboard(d["uid"])["dashboard"].get("description") == d.get("description") for d in docs)


def test_a_dashboard_provisioned_after_the_push_read_it_is_one_line_with_the_way_out(stub, push):
    capacity = next(d for d in committed_dashboards() if d["uid"] == "kvcache-capacity")
    older = with_description(capacity, "an older file")
    stub.then(GET_DASHBOARD, lambda: stub.add_dashboard(older, "kvcache", provisioned_from="kvcache-capacity.json"))
    run = push(stub.url, "--dashboards", str(COMMITTED))
    assert run.code == 1
    assert run.reason == (
        "POST /api/dashboards/db (kvcache-capacity): Grafana refused the save "
        "(400 Cannot save provisioned dashboard): Grafana provisions it from files; change the files, "
        "or run the push again"
    )
    assert stub.dashboard("kvcache-capacity")["dashboard"]["description"] == "an older file"


def test_token_file_wins_over_the_environment(stub, push, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    run = push(stub.url, "--dashboards", str(COMMITTED), "--token-file", str(token_file), env_token="stale")

    assert run.code == 0, run.err
    assert {r.headers.get("Authorization") for r in stub.requests} == {f"Bearer {TOKEN}"}


def test_a_grafana_under_a_sub_path(push):
    stub = GrafanaStub(token=TOKEN, prefix="/grafana")
    try:
        run = push(stub.url + "/", "--dashboards", str(COMMITTED))
        assert run.code == 0, run.err
        assert stub.requests[0].path == "/grafana/api/folders/kvcache"
    finally:
        stub.stop()


def test_org_id_is_sent_as_grafanas_header(stub, push):
    push(stub.url, "--dashboards", str(COMMITTED), "--org-id", "3")
    assert {r.headers.get("X-Grafana-Org-Id") for r in stub.requests} == {"3"}


# --- how a push fails ---------------------------------------------------------------------------------


def test_a_wrong_token_names_its_source_not_the_token(stub, push, tmp_path):
    run = push(stub.url, "--dashboards", str(COMMITTED), env_token="glsa_not_the_right_one")
    assert run.code == 1
    assert run.reason == (
        "GET /api/folders/kvcache: Grafana rejected the token from GRAFANA_TOKEN (401 Invalid API key)"
    )
    assert "glsa_not_the_right_one" not in run.err

    token_file = tmp_path / "token"
    token_file.write_text("glsa_not_the_right_one")
    run = push(stub.url, "--dashboards", str(COMMITTED), "--token-file", str(token_file))
    assert run.code == 1 and f"the token from --token-file {token_file} (401" in run.reason
    assert stub.writes() == []


@pytest.mark.parametrize(
    ("route", "status", "expected"),
    [
        (GET_FOLDER, 403, "GET /api/folders/kvcache: the token from GRAFANA_TOKEN lacks the permission (403 "),
        (CREATE_FOLDER, 403, "Permissions needed: folders:create"),
        (SAVE_DASHBOARD, 403, "Permissions needed: any of dashboards:create, dashboards:write"),
        (CREATE_FOLDER, 409, "POST /api/folders: Grafana refused it (409 a folder/dashboard with the same uid"),
        (
            SAVE_DASHBOARD,
            412,
            "POST /api/dashboards/db (kvcache-capacity): Grafana refused the save "
            "(412 version-mismatch: The dashboard has been changed by someone else): someone changed it",
        ),
        (SAVE_DASHBOARD, 500, "POST /api/dashboards/db (kvcache-capacity): Grafana failed (500 Failed to save"),
        (GET_FOLDER, 500, "GET /api/folders/kvcache: Grafana failed (500 Folder API error)"),
        (GET_DASHBOARD, 503, "GET /api/dashboards/uid/kvcache-capacity: Grafana failed (503 "),
    ],
)
def test_each_refusal_is_one_line_naming_the_reason(stub, push, route, status, expected):
    stub.fail(route, status)
    run = push(stub.url, "--dashboards", str(COMMITTED))
    assert run.code == 1
    assert expected in run.reason
    assert "Traceback" not in run.err


def test_a_404_that_is_not_grafanas_folder_api_is_not_taken_for_a_missing_folder(push):
    stub = GrafanaStub(token=TOKEN, prefix="/grafana")  # Grafana under a sub-path the URL leaves out
    try:
        run = push(f"http://127.0.0.1:{stub.server_address[1]}", "--dashboards", str(COMMITTED))
    finally:
        stub.stop()
    assert run.code == 1
    assert run.reason.startswith(
        "GET /api/folders/kvcache: answered 404 (Not found), not 'folder not found'; is --grafana-url"
    )
    assert stub.writes() == []  # no folder created somewhere that is not Grafana's API


def test_a_folder_deleted_between_the_check_and_the_save(stub, push):
    stub.add_folder("kvcache", "KV cache")
    stub.then(GET_FOLDER, lambda: stub.delete_folder("kvcache"))  # someone deletes it right after the check
    run = push(stub.url, "--dashboards", str(COMMITTED))

    assert run.code == 1
    assert run.lines == ["folder kvcache: exists"]
    assert run.reason == (
        "POST /api/dashboards/db (kvcache-capacity): Grafana refused the save (400 folder not found): "
        "the folder was deleted after the push checked it; run the push again to recreate it"
    )
    run = push(stub.url, "--dashboards", str(COMMITTED))  # the way out works
    assert run.code == 0 and run.lines[0] == "folder kvcache: created"


def test_a_grafana_slower_than_the_timeout(stub, push):
    stub.stall(GET_FOLDER, 5)
    run = push(stub.url, "--dashboards", str(COMMITTED), "--timeout", "0.3")
    assert run.code == 1
    assert run.reason == f"GET /api/folders/kvcache: Grafana at {stub.url} did not answer within 0.3s (--timeout)"


def test_a_refused_connection(push):
    url = f"http://127.0.0.1:{closed_port()}"
    run = push(url, "--dashboards", str(COMMITTED))
    assert run.code == 1
    assert run.reason == f"cannot connect to Grafana at {url}: Connection refused"


def test_a_proxy_echoing_the_request_does_not_get_the_token_printed(stub, push):
    stub.fail(GET_FOLDER, 502, echo_request=True)
    run = push(stub.url, "--dashboards", str(COMMITTED))  # `push` asserts the token is not printed
    assert run.code == 1
    assert "Grafana failed (502" in run.reason


# --- usage and configuration errors (exit 2, nothing sent) ------------------------------------------


def test_no_token_is_a_usage_error(stub, push):
    run = push(stub.url, "--dashboards", str(COMMITTED), env_token=None)
    assert run.code == 2
    assert run.reason == "no Grafana token: set GRAFANA_TOKEN or give --token-file FILE"
    assert stub.requests == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--token-file", "/nonexistent/token"], "cannot read --token-file /nonexistent/token: No such file"),
        (["--dashboards", "/nonexistent"], "/nonexistent: no such file or directory (--dashboards)"),
        (["--folder-uid", "no spaces allowed"], "--folder-uid must be at most 40 letters"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds"),
    ],
)
def test_usage_errors(stub, push, args, expected):
    run = push(stub.url, "--dashboards", str(COMMITTED), *args)
    assert run.code == 2
    assert expected in run.reason
    assert stub.requests == []


@pytest.mark.parametrize(
    "content",
    [
        f"{TOKEN}\n{TOKEN}\n",  # two lines
        f"{TOKEN} # service account kv-sidecar\n",  # a comment after it
        f"Bearer {TOKEN}",  # the header's scheme pasted along
        f"{TOKEN}\x00",  # NUL
        f"{TOKEN}\x1b[0m",  # a terminal escape
        f"{TOKEN}\u200b",  # a zero-width space pasted along (a leading byte-order mark is dropped)
        f"{TOKEN}\u00e9",  # non-ASCII
    ],
    # ids without the random token: every collection (each pytest-xdist worker's) names them alike
    ids=["two-lines", "comment", "bearer-scheme", "nul", "terminal-escape", "zero-width-space", "non-ascii"],
)
def test_a_token_that_is_not_one_printable_word_is_refused(stub, push, tmp_path, content):
    token_file = tmp_path / "token"
    token_file.write_text(content, encoding="utf-8")
    run = push(stub.url, "--dashboards", str(COMMITTED), "--token-file", str(token_file))  # `push` checks no leak
    assert run.code == 2
    assert run.reason == (
        f"the token from --token-file {token_file} has whitespace, control or non-ASCII characters inside it; "
        "it must be the token alone, on one line"
    )
    assert stub.requests == []

    if "\x00" not in content:  # an environment variable cannot hold a NUL
        run = push(stub.url, "--dashboards", str(COMMITTED), env_token=content)
        assert run.code == 2 and run.reason.startswith("the token from GRAFANA_TOKEN has whitespace")
        assert stub.requests == []


def test_urls_that_cannot_be_grafanas(stub, push):
    for url, expected in [
        ("grafana:3000", "must be an http:// or https:// address"),
        (f"http://admin:{TOKEN}@127.0.0.1:3000", "must not carry credentials"),
    ]:
        run = push(url, "--dashboards", str(COMMITTED))
        assert run.code == 2 and expected in run.reason


def test_a_file_that_is_not_a_dashboard(stub, push, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    run = push(stub.url, "--dashboards", str(bad))
    assert run.code == 2 and run.reason.startswith(f"{bad}: not a readable JSON file")

    bad.write_text(json.dumps({"title": "no uid"}))
    run = push(stub.url, "--dashboards", str(bad))
    assert run.code == 2 and "needs a uid" in run.reason
    assert stub.requests == []
