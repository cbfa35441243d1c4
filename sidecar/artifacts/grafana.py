"""``kv-sidecar dashboards push``: upsert the committed dashboards into a Grafana through its HTTP API.

For a Grafana that does not load these dashboards from files: the command ensures the folder (by its
fixed uid, the one the file provisioning uses), then, for each dashboard JSON, reads the one Grafana
holds under the same uid and writes only when something meaningful differs. Each line it prints says
what happened to one dashboard (``kvcache-pod: updated``); ``--dry-run`` reads and reports but never
writes. A dashboard Grafana provisions from files (ours, or the ConfigMaps the Helm chart's sidecar
writes to files) cannot be saved through the API; the command leaves it as it is and says so.

Four details of Grafana's API (Grafana docs, "Dashboard HTTP API" and "Folder HTTP API") decide how a
save is sent:

- ``folderUid`` goes with every save: without it Grafana moves an existing dashboard to the root
  (General) folder.
- ``overwrite: true`` with ``dashboard.id`` null: the uid alone names the dashboard, whatever its
  numeric id or version in this Grafana (an id unknown to Grafana is a 404, a stale version a 412).
- ``id``, ``version`` and ``iteration`` are Grafana's bookkeeping, not content: a dashboard that differs
  only there (and sits in the right folder) is "unchanged" and is not saved, so pushing twice does
  not add versions to its history.
- ``meta.provisioned`` of ``GET /api/dashboards/uid/<uid>`` is true for a dashboard a file provider
  with ``allowUiUpdates: false`` loads; Grafana answers a save of it ``400 Cannot save provisioned
  dashboard`` (``dashboards.ErrDashboardCannotSaveProvisionedDashboard``), so none is sent.

The token comes from ``--token-file`` or ``GRAFANA_TOKEN``, never from a flag (flags end up in shell
history and ``ps``); it is sent as ``Authorization: Bearer …`` and never printed: every failure is one
line ``kv-sidecar dashboards push: <reason>`` that names where the token came from, not the token.
Exit codes: 0 done, 1 Grafana refused or could not be reached, 2 usage or configuration error.

What an answer may do is bounded (:func:`_guard`): each request has ``--timeout`` seconds in all,
however slowly Grafana (or what answers in its place) sends, connect and whole body included (a
``SIGALRM`` timer, the command running in the main thread); a body over :data:`MAX_ANSWER_BYTES` is
refused while it is read; a redirect to another origin (scheme, host, port) is not followed unless
``--follow-redirects`` asks for it, so the dashboards never go where the token does not.

``grafana_client`` (the ``dashboards`` extra) is imported inside the functions that talk to Grafana,
so the sidecar runs without it. It sends its requests with ``niquests``: a refused connection leaves it
as ``niquests.exceptions.ConnectionError``, a timeout as ``GrafanaTimeoutError``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from ..input_files import TOKEN_MAX_BYTES, FileProblem, read_text
from .params import DASHBOARD_FOLDER_TITLE, DASHBOARD_FOLDER_UID

PROG = "kv-sidecar dashboards push"
#: The folder the dashboards live in; the uid is the one the file provisioning gives the same folder.
FOLDER_UID = DASHBOARD_FOLDER_UID
FOLDER_TITLE = DASHBOARD_FOLDER_TITLE
TOKEN_ENV = "GRAFANA_TOKEN"
DEFAULT_TIMEOUT_S = 10.0
#: What Grafana sets on every save; a difference there alone is no change.
BOOKKEEPING_KEYS = frozenset({"id", "version", "iteration"})
#: Grafana's rule for uids (``util.IsValidShortUID``, at most 40 characters).
UID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")
SAVE_MESSAGE = "kv-sidecar dashboards push"
#: The largest answer read from Grafana: the largest dashboard JSON is a few hundred KiB.
MAX_ANSWER_BYTES = 32 << 20
#: What a token may hold: printable ASCII, no space (an HTTP header value; Grafana's tokens are ``glsa_...``).
TOKEN_PATTERN = re.compile(r"^[!-~]+$")


#: The action of a dashboard Grafana provisions from files: left as it is.
PROVISIONED = "provisioned"


class PushError(Exception):
    """A failure the command reports as one line; ``exit_code`` 2 for usage/configuration, 1 otherwise."""

    def __init__(self, reason: str, exit_code: int = 1) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code


class RequestFailed(Exception):
    """One request to Grafana failed; ``cause`` is grafana-client's (or niquests') exception."""

    def __init__(self, request: str, cause: BaseException) -> None:
        super().__init__(f"{request}: {cause}")
        self.request = request
        self.cause = cause


class NotGrafana(Exception):
    """An answer that Grafana's API would not give: a 404 from something else, a non-JSON body."""


@dataclass(frozen=True)
class Outcome:
    """What happened (or, under ``--dry-run``, would happen) to one dashboard or to the folder."""

    name: str  # dashboard uid, or "folder <uid>"
    action: str  # "created", "updated", "unchanged", "provisioned" or, for the folder, "exists"
    dry_run: bool = False

    def line(self) -> str:
        if self.dry_run and self.action in ("created", "updated"):
            return f"{self.name}: would be {self.action}"
        if self.action == PROVISIONED:
            return f"{self.name}: provisioned (kept; Grafana serves it from files)"
        return f"{self.name}: {self.action}"


# --- the dashboards on disk ---------------------------------------------------------------------------


def dashboard_files(paths: Sequence[Path]) -> list[Path]:
    """The JSON files named, each directory standing for the ``*.json`` directly inside it."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            if not found:
                raise PushError(f"no dashboard JSON (*.json) in {path}", exit_code=2)
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise PushError(f"{path}: no such file or directory (--dashboards)", exit_code=2)
    return files


def load_dashboard(path: Path) -> dict[str, Any]:
    """One classic dashboard JSON; it must carry a valid ``uid`` and a ``title``."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PushError(f"{path}: not a readable JSON file ({e})", exit_code=2) from e
    if not isinstance(doc, dict):
        raise PushError(f"{path}: not a dashboard (the JSON is not an object)", exit_code=2)
    uid = doc.get("uid")
    if not isinstance(uid, str) or not UID_PATTERN.match(uid):
        raise PushError(f"{path}: the dashboard needs a uid of at most 40 letters, digits, - or _", exit_code=2)
    if not doc.get("title"):
        raise PushError(f"{path}: the dashboard has no title", exit_code=2)
    return doc


def load_dashboards(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Every dashboard of ``paths`` (files or directories); two files with one uid is an error."""
    dashboards: list[dict[str, Any]] = []
    seen: dict[str, Path] = {}
    for path in dashboard_files(paths):
        doc = load_dashboard(path)
        if doc["uid"] in seen:
            raise PushError(f"{path} and {seen[doc['uid']]} both have uid {doc['uid']}", exit_code=2)
        seen[doc["uid"]] = path
        dashboards.append(doc)
    return dashboards


# --- talking to Grafana -------------------------------------------------------------------------------


def _request(request: str, call: Callable[[], Any], *, missing: str | None = None) -> dict[str, Any] | None:
    """Run one grafana-client call; its JSON object, or ``None`` for Grafana's own 404 saying ``missing``.

    A 404 whose message is not Grafana's "<thing> not found" (a wrong ``--grafana-url`` path answers
    ``{"message": "Not found"}``, a proxy its own page) is a failure, not an absence: creating the folder
    there would only fail later, and less clearly.
    """
    from grafana_client.client import GrafanaClientError, GrafanaException
    from niquests.exceptions import RequestException

    try:
        answer = call()
    except GrafanaClientError as e:
        if missing is None or e.status_code != 404:
            raise RequestFailed(request, e) from e
        said = grafana_message(e)
        if missing in said.lower():
            return None
        raise RequestFailed(request, NotGrafana(f"answered 404 ({said or 'no message'}), not {missing!r}")) from e
    except (GrafanaException, RequestException) as e:
        raise RequestFailed(request, e) from e
    if not isinstance(answer, dict):
        raise RequestFailed(request, NotGrafana("answered with something else than Grafana's JSON"))
    return answer


def grafana_message(e: BaseException) -> str:
    """The ``message`` (and ``status``) of a Grafana error body, or the first line of a non-JSON one."""
    body = getattr(e, "response", None)
    if isinstance(body, dict):
        message = str(body.get("message", ""))
        status = body.get("status")
        return f"{status}: {message}" if status and status not in message else message
    if isinstance(body, str) and body.strip():
        return body.strip().splitlines()[0][:160]
    return ""


def ensure_folder(api: Any, uid: str, title: str, dry_run: bool) -> Outcome:
    """The folder ``uid`` exists (kept as it is, whatever its title) or is created with ``title``."""
    name = f"folder {uid}"
    if _request(f"GET /api/folders/{uid}", partial(api.folder.get_folder, uid), missing="folder not found") is not None:
        return Outcome(name, "exists", dry_run)
    if not dry_run:
        _request("POST /api/folders", partial(api.folder.create_folder, title, uid=uid))
    return Outcome(name, "created", dry_run)


def meaningful(dashboard: Mapping[str, Any]) -> dict[str, Any]:
    """The dashboard without Grafana's bookkeeping (``id``, ``version``, ``iteration``)."""
    return {k: v for k, v in dashboard.items() if k not in BOOKKEEPING_KEYS}


def needed_action(current: Mapping[str, Any] | None, dashboard: Mapping[str, Any], folder_uid: str) -> str:
    """``created``, ``updated``, ``unchanged`` or ``provisioned``: what saving ``dashboard`` would do.

    ``current`` is Grafana's answer to ``GET /api/dashboards/uid/<uid>`` (``dashboard`` and ``meta``), or
    ``None`` when it has none. A dashboard in another folder is "updated": the save moves it.

    A dashboard that differs but that Grafana provisions from files (``meta.provisioned``) is
    "provisioned": not saved, reported, and no failure. Grafana would refuse the save, and what
    serves it there is the mounted files, which only a deployment of the files changes: failing
    would make every push onto such a Grafana fail, for a difference the push cannot remove. The
    line names the dashboard and where Grafana takes it from, so the difference does not go unseen.
    """
    if current is None:
        return "created"
    meta = current.get("meta", {})
    same_folder = meta.get("folderUid", "") == folder_uid
    same_content = meaningful(current.get("dashboard", {})) == meaningful(dashboard)
    if same_folder and same_content:
        return "unchanged"
    return PROVISIONED if meta.get("provisioned") is True else "updated"


def save_body(dashboard: Mapping[str, Any], folder_uid: str) -> dict[str, Any]:
    """The body of ``POST /api/dashboards/db``: overwrite by uid, in ``folder_uid``."""
    return {
        "dashboard": {**dashboard, "id": None},
        "folderUid": folder_uid,
        "overwrite": True,
        "message": SAVE_MESSAGE,
    }


def push(
    api: Any, dashboards: Sequence[Mapping[str, Any]], folder_uid: str, folder_title: str, dry_run: bool
) -> Iterator[Outcome]:
    """Ensure the folder, then save each dashboard that differs, yielding each outcome once it is done.

    ``api`` is a ``grafana_client.GrafanaApi``. Raises :class:`RequestFailed` at the first request that
    fails: the dashboards before it are saved (and were yielded, so the command has printed them), the
    ones after it untouched.
    """
    yield ensure_folder(api, folder_uid, folder_title, dry_run)
    for dashboard in dashboards:
        uid = dashboard["uid"]
        get = partial(api.dashboard.get_dashboard, uid)
        action = needed_action(
            _request(f"GET /api/dashboards/uid/{uid}", get, missing="dashboard not found"), dashboard, folder_uid
        )
        if action in ("created", "updated") and not dry_run:
            save = partial(api.dashboard.update_dashboard, save_body(dashboard, folder_uid))
            _request(f"POST /api/dashboards/db ({uid})", save)
        yield Outcome(uid, action, dry_run)


# --- the command --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where to push and with what: what :func:`connect` needs and what failure messages name."""

    url: str
    token: str = field(repr=False)  # never in a repr, a traceback or a log line
    token_source: str  # "GRAFANA_TOKEN" or "--token-file <path>": named in messages, the token never is
    timeout: float
    verify: bool = True
    org_id: int | None = None
    follow_redirects: bool = False  # to another origin; within Grafana's own origin they are followed


def read_token(token_file: str | None, environ: Mapping[str, str]) -> tuple[str, str]:
    """The token and where it came from: ``--token-file`` wins over ``GRAFANA_TOKEN``.

    Whitespace around it (a file's final newline) is dropped; anything else than one printable ASCII
    word is refused rather than sent: a file with two lines or a pasted control character would
    otherwise reach Grafana as a wrong token, or break the ``Authorization`` header.
    """
    if token_file:
        source = f"--token-file {token_file}"
        try:
            token = read_text(token_file, max_bytes=TOKEN_MAX_BYTES, what="a token file").strip()
        except FileProblem as e:
            raise PushError(f"cannot read {source}: {e.reason}", exit_code=2) from None
        if not token:
            raise PushError(f"{source} is empty", exit_code=2)
    else:
        source = TOKEN_ENV
        token = environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise PushError(f"no Grafana token: set {TOKEN_ENV} or give --token-file FILE", exit_code=2)
    if not TOKEN_PATTERN.match(token):
        raise PushError(
            f"the token from {source} has whitespace, control or non-ASCII characters inside it; "
            "it must be the token alone, on one line",
            exit_code=2,
        )
    return token, source


def check_url(url: str) -> str:
    """``url`` without a trailing slash, if it is an http(s) address without credentials."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PushError(f"--grafana-url must be an http:// or https:// address, not {url!r}", exit_code=2)
    if parts.username or parts.password:
        raise PushError(f"--grafana-url must not carry credentials: put the token in {TOKEN_ENV}", exit_code=2)
    if parts.query or parts.fragment:
        raise PushError("--grafana-url must be Grafana's root address, without ?query or #fragment", exit_code=2)
    try:
        _ = parts.port  # raises ValueError when out of range
    except ValueError as e:
        raise PushError(f"--grafana-url: {e}", exit_code=2) from e
    return url.rstrip("/")


def connect(target: Target) -> Any:
    """A ``grafana_client.GrafanaApi`` for ``target`` (no request is sent yet)."""
    from grafana_client.api import GrafanaApi

    parts = urlsplit(target.url)
    host = parts.hostname or ""
    prefix = parts.path.strip("/")
    kwargs: dict[str, Any] = dict(
        auth=target.token,  # a str: grafana-client sends it as "Authorization: Bearer <token>"
        host=f"[{host}]" if ":" in host else host,  # grafana-client writes host:port as given
        port=parts.port,
        url_path_prefix=f"{prefix}/" if prefix else "",  # it appends "api" right after the prefix
        protocol=parts.scheme,
        verify=target.verify,
        timeout=target.timeout,
        organization_id=target.org_id,
    )
    api = GrafanaApi(**kwargs)
    _guard(api.client.s, target)
    return api


class _OutOfTime(BaseException):
    """Raised by the ``SIGALRM`` handler: a BaseException, so that no ``except OSError`` inside niquests
    mistakes it for a socket error and goes on."""


class AnswerRefused(Exception):
    """An answer :func:`_guard` will not take (too large, a redirect elsewhere); a ``RequestException`` at run time."""


def _guard(session: Any, target: Target) -> None:
    """Bound every request of ``session`` (a ``niquests.Session``): total time, answer size, redirects."""
    from niquests.exceptions import ReadTimeout, RequestException

    class Refused(AnswerRefused, RequestException):
        pass

    origin = _origin(target.url)

    def check(response: Any, *args: Any, **kwargs: Any) -> Any:
        if response.is_redirect and not target.follow_redirects:
            to = urljoin(response.url or target.url, response.headers.get("location", ""))
            if _origin(to) != origin:
                raise Refused(
                    f"answered {response.status_code} redirecting to another origin, {_origin(to)}; not followed "
                    "(give --grafana-url the address that serves, or --follow-redirects)"
                )
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_ANSWER_BYTES:
            raise Refused(f"answered {int(length):,} bytes, more than the {MAX_ANSWER_BYTES >> 20} MiB read")
        body, size = [], 0
        for chunk in response.iter_content(65536):
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                response.close()
                raise Refused(f"answered more than the {MAX_ANSWER_BYTES >> 20} MiB read")
            body.append(chunk)
        response._content = b"".join(body)  # what response.content then returns, read within the bounds
        response._content_consumed = True
        return response

    session.hooks["response"].append(check)
    if target.follow_redirects:
        session.max_redirects = 5
    send = session.request

    def bounded(*args: Any, **kwargs: Any) -> Any:
        try:
            with _deadline(target.timeout):
                return send(*args, **kwargs)
        except _OutOfTime:
            raise ReadTimeout(f"no whole answer within {target.timeout:g}s") from None

    session.request = bounded


def _origin(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return f"{parts.scheme}://{parts.hostname}:{port}"


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`_OutOfTime` in the main thread ``seconds`` from now (elsewhere: no bound)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _os_reason(e: BaseException) -> str:
    """The operating system's words for a failed connection (``Connection refused``).

    They sit at the end of the exception chain niquests raises (its message before them is a long
    ``HTTPConnectionPool(...): Max retries exceeded ...``); a resolver error has no ``strerror``, its
    text is the reason (``Name or service not known: ...``).
    """
    chain = [e]
    while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and len(chain) < 20:
        chain.append(nxt)
    return next((c.strerror for c in chain if isinstance(c, OSError) and c.strerror), str(chain[-1]))


#: What a 412's ``status`` means (Grafana docs, "Dashboard HTTP API", Create / Update dashboard).
PRECONDITION_HINTS = {
    "version-mismatch": "someone changed it in Grafana meanwhile; run the push again",
    "name-exists": "another dashboard of the folder has the same title or uid",
    "plugin-dashboard": "it belongs to a plugin; remove the plugin's copy first",
}
#: What a save's 400 means, by Grafana's message (lower-cased; pkg/services/dashboards/errors.go,
#: pkg/api/apierrors/dashboard.go ``ToDashboardErrorResponse``).
BAD_REQUEST_HINTS = {
    # provisioned after the push read it: the push keeps such dashboards when it sees them
    "cannot save provisioned dashboard": "Grafana provisions it from files; change the files, or run the push again",
    # dashboards.ErrFolderNotFound: the folder was deleted between the push's check and the save
    "folder not found": "the folder was deleted after the push checked it; run the push again to recreate it",
}


def _refusal_hint(status: int, e: BaseException) -> str | None:
    """The way out of a refused save (a 412 by its ``status``, a 400 by its message), if one is known."""
    body = getattr(e, "response", None)
    if not isinstance(body, dict):
        return None
    if status == 412:
        return PRECONDITION_HINTS.get(str(body.get("status")), "Grafana's precondition failed")
    if status == 400:
        return BAD_REQUEST_HINTS.get(str(body.get("message", "")).lower())
    return None


def explain(failure: RequestFailed, target: Target) -> str:
    """One line saying why ``failure`` happened and what to check; the token is never part of it."""
    from grafana_client.client import GrafanaServerError, GrafanaTimeoutError
    from niquests.exceptions import ConnectionError, Timeout

    e, request, where = failure.cause, failure.request, f"Grafana at {target.url}"
    if isinstance(e, GrafanaTimeoutError | Timeout):
        return f"{request}: {where} did not answer within {target.timeout:g}s (--timeout)"
    if isinstance(e, ConnectionError):
        return f"cannot connect to {where}: {_os_reason(e)}"
    if isinstance(e, NotGrafana):
        return f"{request}: {e}; is --grafana-url {target.url} Grafana's address, with its sub-path if any?"
    status, message = getattr(e, "status_code", 0), grafana_message(e)
    said = f"{status} {message}".strip()
    if status == 401:
        return f"{request}: Grafana rejected the token from {target.token_source} ({said})"
    if status == 403:
        return f"{request}: the token from {target.token_source} lacks the permission ({said})"
    if (hint := _refusal_hint(status, e)) is not None:
        return f"{request}: Grafana refused the save ({said}): {hint}"
    if isinstance(e, GrafanaServerError):
        return f"{request}: Grafana failed ({said})"
    if status:
        return f"{request}: Grafana refused it ({said})"
    return f"{request}: {where}: {e}"


def add_push_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``kv-sidecar dashboards push``."""
    parser.add_argument(
        "--grafana-url", required=True, metavar="URL", help="Grafana's address, e.g. http://grafana:3000"
    )
    parser.add_argument(
        "--folder",
        default=FOLDER_TITLE,
        metavar="TITLE",
        help=f"title for the folder if it is created (default: {FOLDER_TITLE})",
    )
    parser.add_argument(
        "--folder-uid",
        default=FOLDER_UID,
        metavar="UID",
        help=f"uid of the folder the dashboards go to; the file provisioning uses {FOLDER_UID} (default: {FOLDER_UID})",
    )
    parser.add_argument(
        "--dashboards",
        nargs="+",
        type=Path,
        default=[Path("dashboards")],
        metavar="PATH",
        help="dashboard JSON files, or directories of them (default: dashboards, relative to the current directory)",
    )
    parser.add_argument("--dry-run", action="store_true", help="report what would change; send no write")
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"file holding the Grafana service-account token (default: the {TOKEN_ENV} environment variable)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"per request, all included however slowly Grafana answers (default: {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--follow-redirects",
        action="store_true",
        help="follow a redirect to another origin (by default refused: the dashboards would go there)",
    )
    parser.add_argument("--insecure-skip-verify", action="store_true", help="do not verify Grafana's TLS certificate")
    parser.add_argument("--org-id", type=int, metavar="ID", help="Grafana organization (default: the token's own)")


def target_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Target:
    """The validated :class:`Target` of the command line; :class:`PushError` (exit 2) when it is wrong."""
    if not args.timeout > 0:
        raise PushError("--timeout must be a positive number of seconds", exit_code=2)
    if not UID_PATTERN.match(args.folder_uid):
        raise PushError("--folder-uid must be at most 40 letters, digits, - or _", exit_code=2)
    url = check_url(args.grafana_url)
    token, source = read_token(args.token_file, environ)
    return Target(
        url,
        token,
        source,
        args.timeout,
        not args.insecure_skip_verify,
        args.org_id,
        getattr(args, "follow_redirects", False),
    )


def push_command(args: argparse.Namespace) -> int:
    """Run ``kv-sidecar dashboards push``: one line per outcome on stdout, or one reason on stderr."""
    target: Target | None = None
    try:
        target = target_from_args(args, os.environ)
        dashboards = load_dashboards(args.dashboards)
        with warnings.catch_warnings():
            if not target.verify:  # asked for: do not repeat it on every request
                warnings.filterwarnings("ignore", message="Unverified HTTPS request")
            for outcome in push(connect(target), dashboards, args.folder_uid, args.folder, args.dry_run):
                print(outcome.line(), flush=True)
    except PushError as e:
        return _fail(e.reason, e.exit_code, target)
    except RequestFailed as e:
        assert target is not None  # requests are only sent once the target is known
        return _fail(explain(e, target), 1, target)
    return 0


def _fail(reason: str, exit_code: int, target: Target | None) -> int:
    if target is not None:  # a server or proxy that echoes the request must not get the token printed
        reason = reason.replace(target.token, "<token>")
    print(f"{PROG}: {reason}", file=sys.stderr)
    return exit_code
