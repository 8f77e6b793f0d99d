"""A fault-injecting gRPC proxy for Spanner: test what your code does when calls fail.

Put :class:`FaultProxy` on 127.0.0.1 in front of the emulator (or any plaintext Spanner
endpoint) and point a client at ``proxy.host``; every call is forwarded as raw bytes, so
it works for every method, the admin API included. Then:

* ``proxy.fail("Commit", "ABORTED")``: the next Commit fails before it reaches Spanner
  (any status code: ``ABORTED``, ``UNAVAILABLE``, ``DEADLINE_EXCEEDED``...);
* ``proxy.lose_reply("Commit")``: the next Commit is applied by Spanner, then the client
  gets an error instead of the reply (a lost commit response: the outcome is unknown);
* ``proxy.hang("Commit", seconds)``: the call waits, then fails with DEADLINE_EXCEEDED;
* ``proxy.hold("ExecuteStreamingSql", wait)``: the call waits for ``wait()`` (a callable
  of the test's, on the proxy's thread), then reaches Spanner (a server that answers
  when the test says so; ``hang(..., wait=)`` does the same before failing); a caller
  gone by the time ``wait()`` returns is counted as ``count(method, "gone while held")``;
* ``proxy.cut_stream("ExecuteStreamingSql", after=1)``: the next stream is cut with
  ``code`` (UNAVAILABLE) after ``after`` result messages (a connection lost mid-result);
* ``proxy.stall_stream("ExecuteStreamingSql", seconds, after=1)``: the next stream goes
  silent after ``after`` messages for ``seconds`` (or the caller's deadline), then fails
  with DEADLINE_EXCEEDED (a TCP pause, a server that stopped answering mid-result);
* ``proxy.go_away()`` / ``proxy.come_back()``: the listener closes (calls in flight are
  cancelled, new ones are refused as when a server dies) and reopens on the same port.

``FaultProxy(target, resume_tokens=True)`` streams results as Spanner does: every result
message carries a resume token (the emulator sends none, so the client reads a whole
result before its first row, and every mid-result fault lands in ``execute``). A stream
resumed from one runs again upstream, and the messages the client already has are
skipped.

``proxy.calls`` lists what happened to each call, ``proxy.count("Commit")`` how many
arrived. :meth:`FaultProxy.emulator` gives an ``Emulator`` handle whose clients and
engines talk through the proxy::

    with FaultProxy(spanner_emulator.host) as proxy:
        engine = proxy.emulator(spanner_emulator).engine(database_id)
        proxy.lose_reply("Commit")
        ...  # your write: it must not double a row nor report one it did not write

grpc is imported when a proxy starts, never at import.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

#: Server-streaming methods of the Spanner API (every other method is unary).
STREAMING_METHODS = frozenset({"ExecuteStreamingSql", "StreamingRead", "BatchWrite"})
#: Streams whose messages get resume tokens, and the type of their request.
_RESUMABLE = {"ExecuteStreamingSql": "ExecuteSqlRequest", "StreamingRead": "ReadRequest"}
#: A resume token of the proxy's: this, then how many messages the stream had sent.
_TOKEN = b"sharded-orm-proxy:"
#: Ports earlier proxies of this process listened on. gRPC shares its connections
#: (subchannels) across the process: a channel to a port whose proxy stopped backs off
#: for up to two minutes, and a new proxy on that port would be refused until then.
_PORTS_USED: set[int] = set()
#: Request headers not forwarded (set by the channel itself).
_HOP_HEADERS = ("user-agent", "grpc-", ":")


@dataclass
class _Rule:
    method: str
    mode: str  # "before", "after" (lost reply), "hang", "cut" or "stall" (mid-stream)
    code: str
    times: int
    message: str
    seconds: float = 0.0
    after: int = 0  # "cut"/"stall": result messages passed before the fault
    wait: Callable[[], object] | None = None  # "hang"/"hold": called first, in the server


class FaultProxy:
    """A gRPC proxy on 127.0.0.1 that forwards to ``target`` and injects faults on demand."""

    def __init__(
        self, target: str, *, port: int = 0, workers: int = 32, resume_tokens: bool = False
    ) -> None:
        import grpc

        self.target = target
        self._types: Any = None
        if resume_tokens:
            from google.cloud.spanner_v1 import types

            self._types = types
        self._grpc = grpc
        self._channel = grpc.insecure_channel(target)
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._workers = workers
        self._server: Any = None
        #: (method, what happened) for every call, in arrival order
        self.calls: list[tuple[str, str]] = []
        self.port = port
        self.come_back()

    # ----------------------------------------------------------------------- lifecycle
    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``: give it to a client as its emulator host."""
        return f"127.0.0.1:{self.port}"

    @property
    def listening(self) -> bool:
        return self._server is not None

    def come_back(self) -> None:
        """Open the listener (again, on the same port; a new proxy's port is one no
        earlier proxy of this process had)."""
        if self._server is not None:
            return
        from concurrent.futures import ThreadPoolExecutor

        held = []  # ports an earlier proxy had, kept bound until a new one is found
        for _ in range(50):
            server = self._grpc.server(
                ThreadPoolExecutor(max_workers=self._workers), handlers=[_Handler(self)]
            )
            bound = server.add_insecure_port(f"127.0.0.1:{self.port}")
            if not bound:
                raise OSError(f"the fault proxy cannot listen on 127.0.0.1:{self.port}")
            if self.port or bound not in _PORTS_USED:
                break
            held.append(server)
        for other in held:
            other.stop(grace=0)
        _PORTS_USED.add(bound)
        self.port = bound
        server.start()
        self._server = server

    def go_away(self) -> None:
        """Close the listener: calls in flight are cancelled, new ones are refused."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=0).wait(5)

    def stop(self) -> None:
        """Close the listener and the upstream channel."""
        self.go_away()
        self._channel.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def emulator(self, emulator: Any) -> Any:
        """An ``Emulator`` handle for the same project and databases, reached through here
        (``Emulator.through``: a database made after this call is found too)."""
        return emulator.through(self.host)

    @contextmanager
    def engine(self, emulator: Any, database: str, **engine_kwargs: Any) -> Iterator[Any]:
        """An engine of ``emulator``'s ``database`` reached through here (``engine_kwargs``
        as ``Emulator.engine`` takes them), its pool holding a session made before any
        fault; on exit the faults are cleared and the engine disposed."""
        engine = self.emulator(emulator).engine(database, **engine_kwargs)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1").scalar()
            yield engine
        finally:
            self.clear()
            engine.dispose()

    # ----------------------------------------------------------------------- faults
    def _add(self, rule: _Rule) -> None:
        if isinstance(rule.times, bool) or not isinstance(rule.times, int) or rule.times < 1:
            raise ValueError(f"times must be an int >= 1, got {rule.times!r}")
        getattr(self._grpc.StatusCode, rule.code.upper())  # an unknown code fails here
        with self._lock:
            self._rules.append(rule)

    def fail(self, method: str, code: str = "UNAVAILABLE", *, times: int = 1,
             message: str = "injected by FaultProxy") -> None:  # fmt: skip
        """The next ``times`` calls of ``method`` fail with ``code`` before reaching Spanner."""
        self._add(_Rule(method, "before", code, times, message))

    def lose_reply(self, method: str = "Commit", code: str = "UNAVAILABLE", *, times: int = 1,
                   message: str = "reply lost by FaultProxy") -> None:  # fmt: skip
        """The next ``times`` calls of ``method`` are applied, then fail with ``code``."""
        self._add(_Rule(method, "after", code, times, message))

    def hang(self, method: str, seconds: float, *, times: int = 1,
             wait: Callable[[], object] | None = None) -> None:  # fmt: skip
        """The next ``times`` calls wait ``seconds`` (or the caller's deadline), then fail
        with DEADLINE_EXCEEDED without reaching Spanner. ``wait``, if given, is called
        first on the proxy's thread: a server that waits for something the test decides
        (the client's event loop turning, say) before it goes silent."""
        rule = _Rule(method, "hang", "DEADLINE_EXCEEDED", times, "hung by FaultProxy", seconds)
        rule.wait = wait
        self._add(rule)

    def hold(self, method: str, wait: Callable[[], object], *, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` call ``wait()`` on the proxy's thread,
        then reach Spanner as usual: a server that answers when the test says so."""
        rule = _Rule(method, "hold", "OK", times, "held by FaultProxy")
        rule.wait = wait
        self._add(rule)

    def cut_stream(self, method: str = "ExecuteStreamingSql", *, after: int = 1,
                   code: str = "UNAVAILABLE", times: int = 1,
                   message: str = "stream cut by FaultProxy") -> None:  # fmt: skip
        """The next ``times`` streams of ``method`` pass ``after`` messages, then fail
        with ``code``: a connection lost mid-result."""
        self._add(_Rule(method, "cut", code, times, message, after=after))

    def stall_stream(self, method: str = "ExecuteStreamingSql", seconds: float = 3600.0, *,
                     after: int = 1, times: int = 1) -> None:  # fmt: skip
        """The next ``times`` streams of ``method`` pass ``after`` messages, then send
        nothing for ``seconds`` (or until the caller's deadline) and fail with
        DEADLINE_EXCEEDED: a server gone silent mid-result."""
        rule = _Rule(method, "stall", "DEADLINE_EXCEEDED", times, "stalled by FaultProxy")
        rule.seconds, rule.after = seconds, after
        self._add(rule)

    def clear(self) -> None:
        """Forget pending faults and the calls seen."""
        with self._lock:
            self._rules.clear()
            self.calls.clear()

    def count(self, method: str, what: str | None = None) -> int:
        """Calls of ``method`` seen (only those with outcome ``what`` if given)."""
        with self._lock:
            return sum(m == method and (what is None or w == what) for m, w in self.calls)

    @property
    def pending(self) -> int:
        """Faults not injected yet."""
        with self._lock:
            return sum(r.times for r in self._rules)

    def _take(self, method: str) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.method == method:
                    rule.times -= 1
                    if rule.times == 0:
                        self._rules.remove(rule)
                    return rule
            return None

    def _record(self, method: str, what: str) -> None:
        with self._lock:
            self.calls.append((method, what))

    # ----------------------------------------------------------------------- forwarding
    def _before(self, name: str, context: Any) -> _Rule | None:
        rule = self._take(name)
        if rule is None:
            return None
        code = getattr(self._grpc.StatusCode, rule.code.upper())
        if rule.mode == "before":
            self._record(name, f"failed {rule.code}")
            context.abort(code, rule.message)
        if rule.mode == "hang":
            self._record(name, "hung")
            if rule.wait is not None:
                self._held(name, rule.wait, context)
            self._wait(rule.seconds, context)
            context.abort(code, rule.message)
        if rule.mode == "hold":
            self._record(name, "held")
            assert rule.wait is not None
            self._held(name, rule.wait, context)
            return None  # forwarded as any call
        return rule

    def _held(self, name: str, wait: Callable[[], object], context: Any) -> None:
        """``wait()``; a caller gone by then (its deadline passed, it cancelled) is
        recorded as "gone while held": what it waited for came only after it gave up."""
        wait()
        if not context.is_active():
            self._record(name, "gone while held")

    @staticmethod
    def _wait(seconds: float, context: Any) -> None:
        """Sleep ``seconds``, or until the caller's deadline passes or it goes away."""
        end = time.monotonic() + seconds
        while context.is_active():
            left = context.time_remaining()
            step = min(end - time.monotonic(), left if left is not None else seconds, 0.05)
            if step <= 0:
                return
            time.sleep(step)

    def _forward_args(self, context: Any) -> dict[str, Any]:
        metadata = [
            (k, v)
            for k, v in context.invocation_metadata()
            if not any(k.startswith(h) for h in _HOP_HEADERS)
        ]
        left = context.time_remaining()
        return {"metadata": metadata, "timeout": left if left is not None and left < 1e6 else None}

    def _after(self, name: str, rule: _Rule | None, context: Any) -> None:
        if rule is not None:  # mode "after": Spanner applied the call; the reply is lost
            self._record(name, "reply lost")
            context.abort(getattr(self._grpc.StatusCode, rule.code.upper()), rule.message)
        self._record(name, "passed")

    def unary(self, method: str, name: str, request: bytes, context: Any) -> bytes:
        rule = self._before(name, context)
        try:
            reply = self._channel.unary_unary(method)(request, **self._forward_args(context))
        except self._grpc.RpcError as exc:
            self._record(name, f"upstream {exc.code().name}")
            context.abort(exc.code(), exc.details() or "")
        self._after(name, rule, context)
        return bytes(reply)

    def stream(self, method: str, name: str, request: bytes, context: Any) -> Iterator[bytes]:
        rule = self._before(name, context)
        midway = rule if rule is not None and rule.mode in ("cut", "stall") else None
        tokens = self._types is not None and name in _RESUMABLE
        skip = 0
        if tokens:
            request, skip = self._resumed(name, request)
        sent = 0
        try:
            for at, reply in enumerate(
                self._channel.unary_stream(method)(request, **self._forward_args(context)), 1
            ):
                if at <= skip:  # the client has it: the stream resumes after it
                    continue
                if midway is not None and sent >= midway.after:
                    self._midway(name, midway, context)
                yield self._with_token(reply, at) if tokens else reply
                sent += 1
            if midway is not None:  # the stream ended before the fault: fault at its end
                self._midway(name, midway, context)
        except self._grpc.RpcError as exc:
            self._record(name, f"upstream {exc.code().name}")
            context.abort(exc.code(), exc.details() or "")
        self._after(name, None if midway is not None else rule, context)

    def _resumed(self, name: str, request: bytes) -> tuple[bytes, int]:
        """The request without a token of ours, and how many messages it resumes after."""
        pb = getattr(self._types, _RESUMABLE[name]).pb().FromString(request)
        if not pb.resume_token.startswith(_TOKEN):
            return request, 0
        skip = int(pb.resume_token[len(_TOKEN) :])
        pb.resume_token = b""
        return pb.SerializeToString(), skip

    def _with_token(self, reply: bytes, at: int) -> bytes:
        pb = self._types.PartialResultSet.pb().FromString(reply)
        pb.resume_token = _TOKEN + str(at).encode()
        return bytes(pb.SerializeToString())

    def _midway(self, name: str, rule: _Rule, context: Any) -> None:
        code = getattr(self._grpc.StatusCode, rule.code.upper())
        if rule.mode == "stall":
            self._record(name, f"stalled after {rule.after}")
            self._wait(rule.seconds, context)
        else:
            self._record(name, f"cut after {rule.after}")
        context.abort(code, rule.message)


class _Handler:
    """grpc's generic handler: every method, request and reply as raw bytes."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy

    def service(self, details: Any) -> Any:
        import grpc

        method: str = details.method
        name = method.rsplit("/", 1)[-1]
        proxy = self.proxy
        if name in STREAMING_METHODS:
            return grpc.unary_stream_rpc_method_handler(
                lambda request, context: proxy.stream(method, name, request, context)
            )
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: proxy.unary(method, name, request, context)
        )
