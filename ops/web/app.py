"""The one ASGI app `evq serve` runs: /v1 (the HTTP API), /ops (the operators' page),
/metrics, /healthz and /openapi.json.

``create_app`` takes a factory of the shared state (ops/wiring.py builds the real one),
so tests and the composition root wire it the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from evq.ops.app.metrics import render
from evq.ops.web import api, page, webhooks
from evq.ops.web.openapi import components
from evq.ops.web.protocol import Guard, about_the_query, error_body
from evq.ops.web.state import AppState
from evq.worker.errors import EvqError, InvalidRequest, NotFound
from evq.worker.logs import get_logger

log = get_logger("evq.http")

DESCRIPTION = """The evq HTTP API: the same operations, bodies and error codes as `evq <noun> <verb> -o json`.

Every body is the contract's wrapper `{status, schema_version: 3, data | error, meta}`; an error's
`error.code` is one of the `E_*` codes (ops/app/cli-schema/error-codes.md). Every /v1 route needs
`Authorization: Bearer <key>` (`evq keys create`): reads any role, enqueue agent or admin,
resolve operator or admin. The one exception is `POST /v1/webhooks/{provider}`, which providers
call: its authentication is the request's signature."""


def _version() -> str:
    try:
        return version("evq")
    except PackageNotFoundError:
        return "0"


def create_app(state: Callable[[], AbstractAsyncContextManager[AppState]], *, max_body: int) -> Any:
    """The app, wrapped in the guard (body limit, timing, headers)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with state() as shared:
            app.state.evq = shared
            yield

    app = FastAPI(
        title="evq",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.include_router(api.router)
    app.include_router(page.router)
    app.include_router(webhooks.router)

    # Like every route but /healthz and /metrics, the document needs a key (any role).
    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(api.caller)])
    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(request.app.openapi())

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        # The queue gauges are a database query: off the event loop.
        body, content_type = await anyio.to_thread.run_sync(
            render, request.app.state.evq.registry, request.headers.get("accept")
        )
        return Response(body, media_type=content_type)

    @app.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse("/ops", status_code=303)

    _handlers(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return Guard(app, max_body=max_body)


def _handlers(app: FastAPI) -> None:
    @app.exception_handler(EvqError)
    async def evq_error(request: Request, exc: EvqError) -> Response:
        return await _error(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        fields = [
            {"field": ".".join(str(p) for p in err["loc"][1:]) or str(err["loc"][0]), "message": err["msg"]}
            for err in exc.errors()
        ]
        return await _error(request, InvalidRequest(fields or [{"field": "$", "message": "invalid request"}]))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            return await _error(request, api.method_not_allowed(request.method))
        if exc.status_code == 404:
            return await _error(
                request, NotFound(f"no route {request.url.path[:200]!r}", hint="GET /openapi.json lists the routes")
            )
        return await _error(request, InvalidRequest([{"field": "$request", "message": str(exc.detail)[:200]}]))

    @app.exception_handler(page.Redirect)
    async def redirect(request: Request, exc: page.Redirect) -> Response:
        return RedirectResponse(exc.url, status_code=303)

    @app.exception_handler(page.PageError)
    async def page_error(request: Request, exc: page.PageError) -> Response:
        return page.render(request, "error.html", await page.shown_session(request), status=exc.status, error=exc.error)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("internal_error", path=request.url.path, error_class=type(exc).__name__)
        return await _error(request, EvqError(f"internal error ({type(exc).__name__}); see the server's log"))


async def _error(request: Request, exc: EvqError) -> Response:
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    names = {p.alias for p in dependant.query_params} if dependant is not None else set()
    exc = about_the_query(request.method, request.url.path, names | set(request.query_params), exc)
    status, body, headers = error_body(exc, getattr(request.state, "timer", None))
    if request.url.path.startswith("/ops") and request.url.path != "/ops/static/ops.css":
        session = await page.shown_session(request)
        html = page.render(request, "error.html", session, status=status, error=_ErrorView(body))
        html.headers.update({k: v for k, v in headers.items() if k != "WWW-Authenticate"})
        return html
    return JSONResponse(body, status_code=status, headers=headers)


class _ErrorView:
    """An error body as the page's template reads it (the attributes of an EvqError)."""

    def __init__(self, body: dict[str, Any]):
        error = body["error"]
        self.code, self.message = error["code"], error["message"]
        self.hint, self.context = error.get("hint"), error.get("context") or {}


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(components(api.COMMANDS))
    doc["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "an evq API key (`evq keys create`)"}
    }
    for path, item in doc["paths"].items():
        for operation in item.values():
            if path.startswith("/v1") and not path.startswith("/v1/webhooks/"):
                operation["security"] = [{"bearer": []}]
    app.openapi_schema = doc
    return doc
