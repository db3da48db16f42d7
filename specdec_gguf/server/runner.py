"""Run the app under uvicorn; Ctrl-C / SIGTERM stop generations within one round and shut down cleanly."""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn

from .app import create_app
from .service import ModelService


class _Server(uvicorn.Server):
    """uvicorn's server, but a signal first cancels the generations so open streams end at once.

    uvicorn re-raises a captured signal after shutting down (which would kill the process
    before the engines are closed); this one records it in ``received`` instead.
    """

    def __init__(self, config: uvicorn.Config, service: ModelService) -> None:
        super().__init__(config)
        self.service = service
        self.received: int | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.received = sig
        self.service.cancel_all()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: don't wait for connections
        else:
            self.should_exit = True


def run_server(service: ModelService, *, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
               log_level: str = "info") -> int | None:
    """Serve until a signal; returns the signal number that stopped it (None if it stopped otherwise).

    The service's worker is stopped before returning; the caller closes the engines.
    """
    config = uvicorn.Config(create_app(service, api_key=api_key), host=host, port=port, log_level=log_level,
                            lifespan="off", timeout_graceful_shutdown=10, access_log=log_level == "debug")
    server = _Server(config, service)
    try:
        server.run()
    finally:
        service.close()
    return server.received
