"""``/docs`` (Swagger UI) served from the package, so the API docs work where there is no internet.

FastAPI's own ``/docs`` loads Swagger UI's script and style from a CDN: on a broker without internet
the page stays blank.  Every sparkmq app builds ``FastAPI(docs_url=None, redoc_url=None)`` and calls
:func:`install_docs`, which serves the same page with ``swagger-ui-dist`` from
:data:`SWAGGER_DIR` (downloaded and checked by ``python3 build.py setup``).
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["VENDOR_DIR", "SWAGGER_DIR", "DOCS_PATH", "DOCS_ASSETS_PATH", "install_docs"]

#: The JavaScript packages ``build.py setup`` bundles (git-ignored package data).
VENDOR_DIR = Path(__file__).resolve().parent / "static" / "vendor"
SWAGGER_DIR = VENDOR_DIR / "swagger-ui-dist"
DOCS_PATH = "/docs"
#: Where Swagger UI's own files are served from.
DOCS_ASSETS_PATH = "/docs-assets"
_SWAGGER_FILES = ("swagger-ui-bundle.js", "swagger-ui.css")


def _assets_missing() -> bool:
    return not all((SWAGGER_DIR / name).is_file() for name in _SWAGGER_FILES)


def install_docs(app: FastAPI) -> None:
    """Serve Swagger UI for ``app``'s OpenAPI at ``/docs`` from the bundled assets (no request leaves the host).

    Without the assets (``build.py setup`` never ran) ``/docs`` answers 503 with what to run instead of a
    blank page.  Example::

        app = FastAPI(docs_url=None, redoc_url=None)
        install_docs(app)
    """
    # check_dir=False: the app still starts without the assets; /docs then says how to get them.
    app.mount(DOCS_ASSETS_PATH, StaticFiles(directory=SWAGGER_DIR, check_dir=False), name="docs-assets")

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        if _assets_missing():
            return HTMLResponse("<h1>API docs unavailable</h1><p>Swagger UI's files are not installed: run "
                                "<code>python3 build.py setup</code>. The OpenAPI document is at "
                                f"<a href='{app.openapi_url}'>{app.openapi_url}</a>.</p>", status_code=503)
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - API docs",
                                   swagger_js_url=f"{root}{DOCS_ASSETS_PATH}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{DOCS_ASSETS_PATH}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{DOCS_ASSETS_PATH}/favicon-32x32.png")
