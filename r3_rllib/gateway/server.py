"""The gateway: an OpenAI-compatible HTTP server (FastAPI, served by uvicorn in a daemon thread) in front of one
generation engine, with per-session call records.

Routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, vLLM's token-in/token-out
``/inference/v1/generate`` (what verifiers' training client calls: it renders the chat itself and sends token ids),
and the same under ``/sessions/<session_id>/`` (a session's calls are recorded; calls outside a session are
served, not recorded). Every error is an OpenAI-style JSON body ``{"error": {"message", "type", "param", "code"}}`` with its
HTTP status; an exception inside a handler is a 500 and the server serves on. ``stream: true`` is answered with
server-sent events carrying the finished completion (one chunk with the whole message and its token ids, one with
the finish reason, then ``[DONE]``): the engine samples whole completions, so nothing arrives earlier.

The server binds 127.0.0.1 unless the caller names another host.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from r3_rllib.engines.base import GenerationEngine, SamplingParams
from r3_rllib.gateway.batcher import Batcher
from r3_rllib.gateway.protocol import GatewayError, stream_chunks
from r3_rllib.gateway.service import GatewayService
from r3_rllib.gateway.sessions import SessionStore
from r3_rllib.types.calls import CallRecord

LOOPBACK = "127.0.0.1"


def _error_response(error: GatewayError) -> Any:
    return JSONResponse(error.body(), status_code=error.status)


async def _read_json(request: Any) -> dict[str, Any]:
    """The request's JSON object; a 400 error for a body that is not one."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GatewayError(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise GatewayError("the request body must be a JSON object", code="invalid_json")
    return body


async def _sse(chunks: list[dict[str, Any]]) -> AsyncIterator[str]:
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


Handler = Callable[[dict[str, Any], "str | None"], Awaitable[dict[str, Any]]]


async def _serve(request: Request, handler: Handler, sid: str | None) -> Any:
    """Run ``handler`` on the request's JSON body: its response (server-sent events when ``stream`` is set), or
    the OpenAI-style error; an unexpected exception is a 500 and the server serves on."""
    try:
        body = await _read_json(request)
        response = await handler(body, sid)
    except GatewayError as e:
        return _error_response(e)
    except Exception as e:  # a bug or an unexpected input: a 500, and the server serves on
        return _error_response(
            GatewayError(f"{type(e).__name__}: {e}", status=500, type="server_error", code="internal_error")
        )
    if body.get("stream"):
        options = body.get("stream_options") or {}
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return StreamingResponse(_sse(stream_chunks(response, usage)), media_type="text/event-stream")
    return JSONResponse(response)


def _post_routes(handler: Handler) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The sessionless and the per-session route functions of a POST endpoint served by ``handler``."""

    async def plain(request: Request) -> Any:
        return await _serve(request, handler, None)

    async def in_session(sid: str, request: Request) -> Any:
        return await _serve(request, handler, sid)

    return plain, in_session


def build_app(service: GatewayService) -> Any:
    """The FastAPI app serving ``service`` (routes in the module docstring)."""
    app = FastAPI(title="r3-rllib rollout gateway", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else "http_error"
        return _error_response(GatewayError(str(exc.detail), status=exc.status_code, code=code))

    endpoints = {
        "/v1/chat/completions": service.chat,
        "/v1/completions": service.completions,
        "/inference/v1/generate": service.generate,
    }
    for path, handler in endpoints.items():
        plain, in_session = _post_routes(handler)
        app.add_api_route(path, plain, methods=["POST"])
        app.add_api_route("/sessions/{sid}" + path, in_session, methods=["POST"])

    @app.get("/v1/models")
    async def list_models() -> Any:
        return JSONResponse(service.models())

    @app.get("/sessions/{sid}/v1/models")
    async def session_models(sid: str) -> Any:
        try:
            service.sessions.get(sid)
        except GatewayError as e:
            return _error_response(e)
        return JSONResponse(service.models())

    return app


class Gateway:
    """An OpenAI-compatible, token-faithful endpoint in front of ``engine`` (see the module docstring, and
    :mod:`r3_rllib.gateway.sessions` for how chat prompts continue across calls, :mod:`r3_rllib.gateway.batcher`
    for batching and seeds, :mod:`r3_rllib.gateway.service` for the context limit).

    ``defaults`` are the sampling parameters a request leaves out (temperature, top_p, top_k, max_new_tokens,
    seed; their stop tokens are always added); ``max_context`` the longest prompt + completion served (None: not
    checked); ``port`` 0 picks a free port; ``max_batch_wait_s`` (default 0.5) the longest a request waits for
    the other open sessions before its batch goes without them. A batch goes at once when every open session has a
    request waiting, so close a session as soon as its program is done: an open, idle session holds the others back
    up to ``max_batch_wait_s`` per call (and makes the batches depend on timing). The gateway starts once; a stopped
    gateway is not restarted.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        *,
        model_name: str = "policy",
        defaults: SamplingParams | None = None,
        max_context: int | None = None,
        host: str = LOOPBACK,
        port: int = 0,
        max_batch_wait_s: float = 0.5,
    ) -> None:
        if max_context is not None and max_context < 2:
            raise ValueError(f"max_context must be >= 2 tokens, got {max_context}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.host = host
        self._port = int(port)
        self.sessions = SessionStore(on_change=self._wake)
        self.batcher = Batcher(engine, self.sessions.open_ids, max_batch_wait_s=max_batch_wait_s)
        self.service = GatewayService(
            tokenizer,
            self.batcher,
            self.sessions,
            model_name=model_name,
            defaults=defaults if defaults is not None else SamplingParams(),
            max_context=max_context,
        )
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _wake(self) -> None:
        self.batcher.wake()

    # -- lifecycle ----------------------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> Gateway:
        """Serve in a background thread (once; later calls do nothing) and return self; RuntimeError when the
        server does not come up within ``timeout_s``."""
        import uvicorn

        with self._lock:
            if self._thread is not None:
                return self
            self.batcher.start()
            config = uvicorn.Config(
                build_app(self.service),
                host=self.host,
                port=self._port,
                log_level="warning",
                access_log=False,
                log_config=None,  # leave the host process's logging configuration alone
                lifespan="off",
                timeout_keep_alive=30,
            )
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(target=self._server.run, name="r3-gateway-http", daemon=True)
            self._thread.start()
            deadline = time.monotonic() + timeout_s
            while not self._server.started:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    self._thread = None
                    self.batcher.stop()
                    raise RuntimeError(f"the gateway's server did not start on {self.host}:{self._port}")
                time.sleep(0.01)
            self._port = int(self._server.servers[0].sockets[0].getsockname()[1])
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop serving and stop the engine thread (requests still waiting fail)."""
        with self._lock:
            if self._server is not None:
                self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout_s)
            self._server, self._thread = None, None
            self.batcher.stop(timeout_s)

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses ------------------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port served (known once started when it was 0)."""
        return self._port

    @property
    def _root(self) -> str:
        if self._thread is None:
            raise RuntimeError("the gateway is not started: call start()")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._port}"

    @property
    def base_url(self) -> str:
        """The sessionless OpenAI base URL (calls served, not recorded)."""
        return f"{self._root}/v1"

    def session_base_url(self, session_id: str) -> str:
        """The OpenAI base URL whose calls are recorded in ``session_id`` (for ``openai.AsyncOpenAI(base_url=)``)."""
        return f"{self._root}/sessions/{session_id}/v1"

    # -- sessions and defaults ----------------------------------------------------------------------------------
    def open_session(self, session_id: str | None = None) -> str:
        """Open a session (a fresh id when None) and return its id; ValueError when that id is open already."""
        return self.sessions.open(session_id if session_id is not None else uuid.uuid4().hex)

    def close_session(self, session_id: str) -> list[CallRecord]:
        """Close the session and return its calls' records in call order; KeyError for an unknown session."""
        return self.sessions.close(session_id)

    def set_defaults(self, params: SamplingParams) -> None:
        """The sampling defaults of the calls that arrive from now on."""
        self.service.defaults = params

    @property
    def defaults(self) -> SamplingParams:
        return self.service.defaults

    @property
    def model_name(self) -> str:
        return self.service.model_name
