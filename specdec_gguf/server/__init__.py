"""The OpenAI-compatible HTTP server (``specdec serve``), importable and testable without the CLI.

- ``service``: :class:`ModelService`, one model behind a bounded queue, generating in a worker thread;
- ``schema``: request validation and OpenAI-style errors;
- ``app``: the Starlette app (routes, server-sent events, the API key);
- ``runner``: uvicorn with a clean shutdown on Ctrl-C / SIGTERM.
"""

from .app import create_app
from .runner import run_server
from .schema import RequestError
from .service import ModelService

__all__ = ["create_app", "run_server", "ModelService", "RequestError"]
