"""The page's one stylesheet and its one small script (optional: every action works without it)."""

from __future__ import annotations

from importlib import resources

from fastapi.responses import Response

from evq.ops.web.page.common import router


@router.get("/static/ops.css")
async def stylesheet() -> Response:
    css = resources.files("evq.ops.web").joinpath("static", "ops.css").read_text(encoding="utf-8")
    return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


# The scripts the page may load (CSP script-src 'self'), by name: nothing else under static/ is served.
SCRIPTS = ("desk.js",)


@router.get("/static/{name}.js")
async def script(name: str) -> Response:
    if f"{name}.js" not in SCRIPTS:
        return Response("not found", status_code=404, media_type="text/plain")
    js = resources.files("evq.ops.web").joinpath("static", f"{name}.js").read_text(encoding="utf-8")
    return Response(js, media_type="text/javascript", headers={"Cache-Control": "max-age=3600"})
