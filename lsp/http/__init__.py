"""``specd serve --http``: the engine over HTTP, in the shapes existing clients speak.

OpenAI's ``/v1/completions`` and ``/v1/models``, llama.cpp's ``/infill`` (llama.vim,
llama.vscode), ``/health`` and Prometheus ``/metrics``. One engine serves one generation
at a time; requests wait in a fair, bounded queue (:mod:`specd.lsp.runner`).
"""

from .app import create_app, run_http, start
from .service import HttpService

__all__ = ["HttpService", "create_app", "run_http", "start"]
