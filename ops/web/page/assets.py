"""The page's one stylesheet (no script, no other asset)."""

from __future__ import annotations

from importlib import resources

from fastapi.responses import Response

from evq.ops.web.page.common import router


@router.get("/static/ops.css")
async def stylesheet() -> Response:
    css = resources.files("evq.ops.web").joinpath("static", "ops.css").read_text(encoding="utf-8")
    return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})
