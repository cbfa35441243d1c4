"""A local stand-in for Grafana's HTTP API, recording every request, for the ``dashboards push`` tests.

No Grafana server can be installed here (none of the reachable package registries carries one), so
``kv-sidecar dashboards push`` is tested against this server instead. It answers the four endpoints
grafana-client calls for a push as Grafana 11 does, with Grafana's status codes and response bodies:

* ``GET /api/folders/<uid>`` and ``POST /api/folders`` (Grafana docs, "Folder HTTP API",
  https://grafana.com/docs/grafana/v11.6/developers/http_api/folder/);
* ``GET /api/dashboards/uid/<uid>`` and ``POST /api/dashboards/db`` (Grafana docs, "Dashboard HTTP API",
  https://grafana.com/docs/grafana/v11.6/developers/http_api/dashboard/).

The error bodies are the ones Grafana's source writes (pkg/services/dashboards/errors.go,
pkg/api/apierrors/folder.go and dashboard.go, pkg/api/dashboard.go ``postDashboard``, the access-control
middleware's "Access denied" and ``ReqContext.writeErrOrFallback`` for authentication errors): see
``ERROR_BODIES``. The rules a save follows are Grafana's too: ``overwrite`` false with another version
is a 412, an unknown ``folderUid`` a 400, an ``id`` Grafana does not hold a 404, a dashboard a file
provider loads with ``allowUiUpdates: false`` a 400 (``ErrDashboardCannotSaveProvisionedDashboard``),
and a save *without* ``folderUid`` puts the dashboard in the root (General) folder, which is the trap
the command avoids. A provisioned dashboard reads as Grafana's ``GetDashboard`` writes it:
``meta.provisioned`` true only when the provider forbids UI updates, ``meta.provisionedExternalId``
its file, relative to the provider's path.

Folders and dashboards live in memory. Every request is kept in ``requests`` (method, path, headers,
JSON body) for the tests to assert on. ``fail(route, status)`` makes one endpoint answer an error,
``stall(route, seconds)`` makes it answer late (for timeouts), ``then(route, action)`` runs ``action``
once the next request to ``route`` is answered (someone changing Grafana between two requests).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: The endpoints, as ``"<METHOD> <path pattern>"`` (the names ``fail`` and ``stall`` take).
GET_FOLDER = "GET /api/folders/:uid"
CREATE_FOLDER = "POST /api/folders"
GET_DASHBOARD = "GET /api/dashboards/uid/:uid"
SAVE_DASHBOARD = "POST /api/dashboards/db"
ROUTES = {
    GET_FOLDER: re.compile(r"^GET /api/folders/(?P<uid>[^/]+)$"),
    CREATE_FOLDER: re.compile(r"^POST /api/folders$"),
    GET_DASHBOARD: re.compile(r"^GET /api/dashboards/uid/(?P<uid>[^/]+)$"),
    SAVE_DASHBOARD: re.compile(r"^POST /api/dashboards/db$"),
}

#: Grafana's ``writeErrOrFallback`` body for a token it does not know (authn ``errAPIKeyInvalid``).
INVALID_API_KEY = {
    "extra": None,
    "message": "Invalid API key",
    "messageId": "api-key.invalid",
    "statusCode": 401,
    "traceID": "",
}
#: ... and for a request without credentials (anonymous access off).
UNAUTHORIZED = {
    "extra": None,
    "message": "Unauthorized",
    "messageId": "auth.unauthorized",
    "statusCode": 401,
    "traceID": "",
}
#: The permission each route's access-control check asks for (named in Grafana's 403 body).
PERMISSIONS = {
    GET_FOLDER: "folders:read",
    CREATE_FOLDER: "folders:create",
    GET_DASHBOARD: "dashboards:read",
    SAVE_DASHBOARD: "any of dashboards:create, dashboards:write",
}
#: Grafana's body for an /api path it has no route for (``notFoundHandler``: ``JsonApiErr(404, "Not found")``).
NO_ROUTE = {"message": "Not found"}
FOLDER_NOT_FOUND = {"status": "not-found", "message": "folder not found"}
DASHBOARD_NOT_FOUND = {"status": "not-found", "message": "Dashboard not found"}
VERSION_MISMATCH = {"status": "version-mismatch", "message": "The dashboard has been changed by someone else"}
#: A save into a folder Grafana does not hold: the folder service's ``dashboards.ErrFolderNotFound``,
#: which ``ToDashboardErrorResponse`` answers as ``response.Error(400, err.Error(), nil)``.
SAVE_FOLDER_NOT_FOUND = {"message": "folder not found"}
#: ``dashboards.ErrDashboardCannotSaveProvisionedDashboard`` (a 400 ``DashboardErr`` without ``status``).
CANNOT_SAVE_PROVISIONED = {"message": "Cannot save provisioned dashboard"}

#: The body Grafana sends with each (route, status) a test can force with :meth:`GrafanaStub.fail`.
ERROR_BODIES: dict[tuple[str, int], dict[str, Any]] = {
    (GET_FOLDER, 404): FOLDER_NOT_FOUND,
    (GET_FOLDER, 500): {"message": "Folder API error"},
    (CREATE_FOLDER, 400): {"message": "folder title cannot be empty"},
    (CREATE_FOLDER, 409): {"message": "a folder/dashboard with the same uid already exists"},
    (CREATE_FOLDER, 500): {"message": "Folder API error"},
    (GET_DASHBOARD, 404): DASHBOARD_NOT_FOUND,
    (SAVE_DASHBOARD, 400): SAVE_FOLDER_NOT_FOUND,
    (SAVE_DASHBOARD, 404): DASHBOARD_NOT_FOUND,
    (SAVE_DASHBOARD, 412): VERSION_MISMATCH,
    (SAVE_DASHBOARD, 500): {"message": "Failed to save dashboard"},
}


def error_body(route: str, status: int) -> Any:
    """What Grafana answers on ``route`` with ``status``."""
    if status == 401:
        return INVALID_API_KEY
    if status == 403:
        return {
            "accessErrorId": "ACE0123456789",
            "message": f"You'll need additional permissions to perform this action. Permissions needed: "
            f"{PERMISSIONS[route]}",
            "title": "Access denied",
        }
    return ERROR_BODIES.get((route, status), {"message": "Internal Server Error"})


@dataclass
class Recorded:
    """One request as the stub received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any = None

    @property
    def route(self) -> str | None:
        return _route_of(self.method, self.path)


@dataclass
class Failure:
    status: int
    body: Any  # JSON-able, or a str sent as text/plain
    echo_request: bool = False


@dataclass
class _State:
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: uid -> {"dashboard": the saved JSON (with Grafana's id and version), "folderUid": str,
    #: "provisionedFrom": its file when a file provider loads it (else None), "allowUiUpdates": bool}
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    next_id: int = 1


def _route_of(method: str, path: str) -> str | None:
    line = f"{method} {path.split('?', 1)[0]}"
    return next((name for name, pattern in ROUTES.items() if pattern.match(line)), None)


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _is_read_only(stored: dict[str, Any]) -> bool:
    """Whether Grafana refuses API saves of ``stored``: a file provider loads it and forbids UI updates."""
    return stored["provisionedFrom"] is not None and not stored["allowUiUpdates"]


class GrafanaStub(ThreadingHTTPServer):
    """Grafana's API on ``127.0.0.1`` (a free port) for one token; ``prefix`` serves it under a sub-path."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, token: str, prefix: str = "") -> None:
        self.token = token
        self.prefix = prefix.rstrip("/")
        self.state = _State()
        self.requests: list[Recorded] = []
        self.failures: dict[str, Failure] = {}
        self.stalls: dict[str, float] = {}
        self.actions: dict[str, Callable[[], None]] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{self.prefix}"

    def stop(self) -> None:
        self.stopping.set()  # wakes stalled handlers
        self.shutdown()
        self.server_close()

    # --- what a test sets up and reads -------------------------------------------------------------

    def fail(self, route: str, status: int, body: Any = None, *, echo_request: bool = False) -> None:
        """Make ``route`` answer ``status`` with Grafana's body for it (or ``body``).

        ``echo_request`` answers a text line quoting the request's ``Authorization`` header, as a
        proxy in front of Grafana might: the command must not print what it echoes.
        """
        self.failures[route] = Failure(status, error_body(route, status) if body is None else body, echo_request)

    def stall(self, route: str, seconds: float) -> None:
        """Make ``route`` wait ``seconds`` before it answers."""
        self.stalls[route] = seconds

    def then(self, route: str, action: Callable[[], None]) -> None:
        """Run ``action`` once, right after the next request to ``route`` is answered (before it is sent)."""
        self.actions[route] = action

    def writes(self) -> list[Recorded]:
        """The POST requests received, in order."""
        return [r for r in self.requests if r.method == "POST"]

    def add_folder(self, uid: str, title: str) -> dict[str, Any]:
        with self.lock:
            return self._create_folder(uid, title)

    def delete_folder(self, uid: str) -> None:
        """Delete the folder ``uid`` and, as Grafana does, the dashboards in it."""
        with self.lock:
            del self.state.folders[uid]
            for dashboard_uid in [u for u, d in self.state.dashboards.items() if d["folderUid"] == uid]:
                del self.state.dashboards[dashboard_uid]

    def add_dashboard(
        self,
        dashboard: dict[str, Any],
        folder_uid: str,
        *,
        provisioned_from: str | None = None,
        allow_ui_updates: bool = False,
    ) -> None:
        """Store ``dashboard`` as if someone had saved it in Grafana, or a file provider had loaded it.

        ``provisioned_from`` names the file (relative to the provider's path) for a provisioned one;
        ``allow_ui_updates`` is that provider's ``allowUiUpdates``.
        """
        with self.lock:
            status, answer = self._save({"dashboard": dashboard, "folderUid": folder_uid, "overwrite": True})
            assert status == 200, answer
            stored = self.state.dashboards[answer["uid"]]
            stored.update(provisionedFrom=provisioned_from, allowUiUpdates=allow_ui_updates)

    def dashboard(self, uid: str) -> dict[str, Any]:
        """The stored dashboard ``uid`` (its JSON with Grafana's ``id``/``version``) and its ``folderUid``."""
        return self.state.dashboards[uid]

    # --- Grafana's behaviour -----------------------------------------------------------------------

    def answer(self, route: str, match: re.Match[str], body: Any) -> tuple[int, Any]:
        with self.lock:
            if route == GET_FOLDER:
                folder = self.state.folders.get(match["uid"])
                return (200, folder) if folder else (404, FOLDER_NOT_FOUND)
            if route == CREATE_FOLDER:
                return self._post_folder(body)
            if route == GET_DASHBOARD:
                return self._get_dashboard(match["uid"])
            return self._save(body)

    def _create_folder(self, uid: str, title: str) -> dict[str, Any]:
        folder = {
            "id": self.state.next_id,
            "uid": uid,
            "orgId": 1,
            "title": title,
            "url": f"/dashboards/f/{uid}/{_slug(title)}",
            "hasAcl": False,
            "canSave": True,
            "canEdit": True,
            "canAdmin": True,
            "canDelete": True,
            "createdBy": "admin",
            "created": "2026-01-01T00:00:00Z",
            "updatedBy": "admin",
            "updated": "2026-01-01T00:00:00Z",
            "version": 1,
        }
        self.state.next_id += 1
        self.state.folders[uid] = folder
        return folder

    def _post_folder(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or not body.get("title"):
            return 400, ERROR_BODIES[(CREATE_FOLDER, 400)]
        uid = body.get("uid") or f"generated{self.state.next_id}"
        if uid in self.state.folders or uid in self.state.dashboards:
            return 409, ERROR_BODIES[(CREATE_FOLDER, 409)]
        return 200, self._create_folder(uid, body["title"])

    def _get_dashboard(self, uid: str) -> tuple[int, Any]:
        stored = self.state.dashboards.get(uid)
        if stored is None:
            return 404, DASHBOARD_NOT_FOUND
        dashboard, folder_uid = stored["dashboard"], stored["folderUid"]
        folder = self.state.folders.get(folder_uid, {"id": 0, "title": "General"})
        meta = {
            "type": "db",
            "canSave": True,
            "canEdit": True,
            "slug": _slug(dashboard["title"]),
            "url": f"/d/{uid}/{_slug(dashboard['title'])}",
            "version": dashboard["version"],
            "folderId": folder["id"],
            "folderUid": folder_uid,
            "folderTitle": folder["title"],
            # GetDashboard: provisioned only when the provider forbids UI updates; the file either way
            "provisioned": _is_read_only(stored),
            "provisionedExternalId": stored["provisionedFrom"] or "",
        }
        return 200, {"dashboard": dashboard, "meta": meta}

    def _save(self, body: Any) -> tuple[int, Any]:
        """``POST /api/dashboards/db`` by Grafana's rules (pkg/api/dashboard.go, dashboard service)."""
        dashboard = body.get("dashboard") if isinstance(body, dict) else None
        if not isinstance(dashboard, dict) or not dashboard.get("title"):
            return 400, {"message": "Dashboard title cannot be empty", "status": "empty-name"}
        folder_uid = body.get("folderUid") or ""  # none given: the root (General) folder
        if folder_uid and folder_uid not in self.state.folders:
            return 400, SAVE_FOLDER_NOT_FOUND
        uid = dashboard.get("uid") or f"generated{self.state.next_id}"
        existing = self.state.dashboards.get(uid, {}).get("dashboard")
        if dashboard.get("id") and (existing is None or existing["id"] != dashboard["id"]):
            return 404, DASHBOARD_NOT_FOUND
        if existing and not body.get("overwrite") and dashboard.get("version") != existing["version"]:
            return 412, VERSION_MISMATCH
        stored = self.state.dashboards.get(uid)
        if stored is not None and _is_read_only(stored):
            return 400, CANNOT_SAVE_PROVISIONED
        saved = {
            **dashboard,
            "uid": uid,
            "id": existing["id"] if existing else self.state.next_id,
            "version": existing["version"] + 1 if existing else 1,
        }
        if not existing:
            self.state.next_id += 1
        provisioning = {"provisionedFrom": None, "allowUiUpdates": False}
        if stored is not None:  # a save allowed by allowUiUpdates keeps the dashboard provisioned
            provisioning = {k: stored[k] for k in provisioning}
        self.state.dashboards[uid] = {"dashboard": saved, "folderUid": folder_uid, **provisioning}
        slug = _slug(saved["title"])
        return 200, {
            "id": saved["id"],
            "uid": uid,
            "url": f"/d/{uid}/{slug}",
            "status": "success",
            "version": saved["version"],
            "slug": slug,
            "folderUid": folder_uid,
        }


class _Handler(BaseHTTPRequestHandler):
    server: GrafanaStub
    protocol_version = "HTTP/1.1"  # keep-alive, as Grafana

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def log_message(self, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        body = self._read_body()
        stub = self.server
        path = self.path
        with stub.lock:
            stub.requests.append(Recorded(self.command, path, dict(self.headers.items()), body))
        if stub.prefix:
            if not path.startswith(stub.prefix + "/"):
                return self._send(404, NO_ROUTE)
            path = path[len(stub.prefix) :]
        route = _route_of(self.command, path)
        if route is None:
            return self._send(404, NO_ROUTE)
        if route in stub.stalls and stub.stopping.wait(stub.stalls[route]):
            return None  # the stub is stopping: the client gave up long ago
        status, answer = self._answer(route, path, body)
        action = stub.actions.pop(route, None)
        if action is not None:
            action()
        try:
            self._send(status, answer)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out before the stall ended
        return None

    def _answer(self, route: str, path: str, body: Any) -> tuple[int, Any]:
        stub = self.server
        given = self.headers.get("Authorization")
        if given != f"Bearer {stub.token}":
            return 401, UNAUTHORIZED if given is None else INVALID_API_KEY
        failure = stub.failures.get(route)
        if failure is not None:
            if failure.echo_request:
                return failure.status, f"upstream error for {self.command} {path} (Authorization: {given})"
            return failure.status, failure.body
        match = ROUTES[route].match(f"{self.command} {path.split('?', 1)[0]}")
        assert match is not None
        return stub.answer(route, match, body)

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _send(self, status: int, answer: Any) -> None:
        if isinstance(answer, str):
            data, content_type = answer.encode(), "text/plain; charset=utf-8"
        else:
            data, content_type = json.dumps(answer).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
