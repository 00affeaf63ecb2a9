"""Per-tool hints for agents that send none: what a router calls on each request and response.

One :class:`ConversationHints` per router.  Per chat request and response::

    router                                  ConversationHints
    ------                                  -----------------
    request arrives (t_req)  ------------>  on_request(body, t_req)
                                              name the trajectory (naming.py)
                                              the request carries tool results?
                                                wait = t_req - end of the last response,
                                                learned under the TRUE tool (named in the
                                                request's own history)  -> Observation
                                              forecast the next tool (next_tool.py)
    forward Forwarded.body   <------------    hint {"kvtier": {"tool": forecast, ...}}
    (engine plans the pause on the forecast tool, at its first store job)
    stream bytes pass        ------------>  stream(tid).feed(bytes)  -> tool names, early
    response ends (t_end)    ------------>  .end(t_end) / on_response(tid, json, t_end)
                                              the pause starts: PauseStart(forecast, true tool)
    named, or ended          ------------>  retag(tid) -> Retag once, if the tool is not the forecast

The race: the tool of the pause that starts when a response ends is named
in that response, but the hint rode on its request.  So the hint carries a
*forecast* (the trajectory's likely next tool), and the truth is used as soon
as it is known: the transition is learned when the name is parsed (early in a
stream; with the body for JSON), and the wait is learned under the true tool
when the next request arrives (that request names the tool it answers, so the
label needs no parse at all: the parse only makes it known earlier, and a
disagreement is counted).  The engine's lifecycle plans the pause on the
forecast tool until it hears otherwise: :meth:`ConversationHints.retag`
answers, once per turn, the correction to send when the parsed tool is not
the forecast (the router sends it to the engine that served the turn as a
tiny request, :class:`~.hint.Retag`), and the lifecycle then plans the
pause, and learns its wait, on the true tool.  ``kvtier bench predictor
--conversation`` measures each (docs/conversation-hints.md).

Never raises into the router: unreadable input is passed through as it came
(counted in :meth:`stats`, the last error kept shortened).  Bounded: at most
``max_trajectories`` trajectories (least recently used forgotten) besides the
namer's and forecaster's own bounds.  Thread-safe: one lock; a stream's bytes
are parsed outside it.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from .hint import Retag, carries_hint, make_hint, with_hint
from .messages import ToolCall, read_request, tool_calls_of_response, usage_tokens
from .naming import TrajectoryNamer
from .next_tool import NextTool, NextToolForecaster
from .sse import ToolCallStream

log = logging.getLogger("kvtier.conversation")


class WaitLearner(Protocol):
    """What learns the waits (a :class:`~kvtier.tiering.forecasting.predictor.ToolWaitPredictor`
    is one): ``observe`` raises ValueError for a wait it refuses."""

    def observe(self, tool: str, seconds: float) -> None: ...


@dataclass(frozen=True)
class Observation:
    """One learned wait: ``tool`` (the true one), ``wait_s``, and ``forecast``
    (the tool the engine was told for that pause; None: none)."""

    trajectory_id: str
    tool: str
    wait_s: float
    forecast: str | None

    @property
    def correct(self) -> bool:
        return self.forecast == self.tool


@dataclass(frozen=True)
class Forwarded:
    """What to send on for one request.  ``body``: the request with the hint
    (the caller's own object when nothing was added); ``trajectory_id`` None:
    not a request this reads (passed through); ``hint``: what was added (None:
    nothing, e.g. the agent sent its own); ``observed``: the wait this request
    ended (None: it carries no tool results of a pause we saw end)."""

    body: object
    trajectory_id: str | None = None
    forecast: NextTool | None = None
    hint: Mapping[str, object] | None = None
    observed: Observation | None = None


@dataclass(frozen=True)
class PauseStart:
    """A response ended: the pause of ``trajectory_id`` starts, forecast as
    ``forecast`` and, as parsed, on ``tool`` (None: the response called none)."""

    trajectory_id: str
    forecast: str | None
    tool: str | None


@dataclass
class _Turn:                           # a request sent, its response pending or ended
    forecast: str | None
    last: str | None                   # the tool whose results the request carried
    n_messages: int                    # the request's messages (a retry resends as many)
    calls: tuple[ToolCall, ...] = ()   # parsed from the response
    ended_at: float | None = None
    learned: bool = False              # its transition was learned from the parse
    hinted: bool = False               # the router added the hint (not the client)
    retag_asked: bool = False          # retag() answered for it once


@dataclass
class _Trajectory:
    agent: str
    turn: _Turn | None = None
    context_tokens: int | None = None


class ConversationHints:
    """See the module doc.

    predictor:  learns each true tool's waits (``observe(tool, seconds)``, e.g.
                a :class:`~kvtier.tiering.forecasting.predictor.ToolWaitPredictor`;
                None: learn none here, the caller forwards :attr:`Forwarded.observed`).
    clock:      the time of an event whose caller passes none (monotonic seconds).
    """

    def __init__(self, predictor: WaitLearner | None = None, *, namer: TrajectoryNamer | None = None,
                 forecaster: NextToolForecaster | None = None, max_trajectories: int = 20_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.predictor = predictor
        self.namer = namer or TrajectoryNamer()
        self.forecaster = forecaster or NextToolForecaster()
        self.max_trajectories = max_trajectories
        self._clock = clock
        self._lock = threading.Lock()
        self._trajs: OrderedDict[str, _Trajectory] = OrderedDict()
        self.counters: Counter[str] = Counter()
        self.last_error: str | None = None

    # -- requests
    def on_request(self, body: object, now: float | None = None) -> Forwarded:
        """A chat request arrives; what to forward.  Never raises."""
        now = self._clock() if now is None else float(now)
        with self._lock:
            self.counters["requests"] += 1
            try:
                return self._request(body, now)
            except Exception as exc:      # bad input, and whatever a hostile object raises
                self._failed("request", exc)
                return Forwarded(body)

    def _request(self, body: object, now: float) -> Forwarded:
        req = read_request(body)
        names = self.namer.name(body, req.messages)
        tid = names.trajectory_id
        t = self._trajs.get(tid)
        if t is None:
            t = self._trajs[tid] = _Trajectory(names.agent)
            while len(self._trajs) > self.max_trajectories:
                self._trajs.popitem(last=False)
        else:
            self._trajs.move_to_end(tid)
        if t.turn is not None and len(req.messages) <= t.turn.n_messages:
            self.counters["retries"] += 1     # the same turn again: its pause has not started
            t.turn = None
            observed = None
        else:
            observed = self._learn_wait(tid, t, req.answered, now)
        if carries_hint(body):
            self.counters["client_hinted"] += 1
            t.turn = _Turn(None, req.last_tool, len(req.messages))
            return Forwarded(body, tid, observed=observed)
        fc = self.forecaster.forecast(t.agent, tid, req.last_tool)
        self.counters[f"forecast:{fc.source}"] += 1
        hint = make_hint(fc.tool, tid, t.context_tokens)
        t.turn = _Turn(fc.tool, req.last_tool, len(req.messages), hinted=True)
        return Forwarded(with_hint(body, hint), tid, fc, hint, observed)

    def _learn_wait(self, tid: str, t: _Trajectory, answered: tuple[ToolCall, ...], now: float) -> Observation | None:
        turn = t.turn
        if not answered:
            return None
        if turn is None or turn.ended_at is None:
            self.counters["results_without_pause"] += 1     # we never saw that response end
            return None
        tool = answered[0].name                              # the request names what it answers
        if turn.calls and turn.calls[0].name != tool:
            self.counters["label_disagreements"] += 1
        if not turn.learned:
            self.forecaster.observe(t.agent, tid, turn.last, tool)
        obs = Observation(tid, tool, max(0.0, now - turn.ended_at), turn.forecast)
        t.turn = None
        self.counters["observations"] += 1
        self.counters["forecast_correct"] += obs.correct
        if self.predictor is not None:
            try:
                self.predictor.observe(tool, obs.wait_s)
            except Exception as exc:          # a refused wait, or the learner's own failure
                self._failed("observe", exc)
        return obs

    # -- responses
    def on_response(self, trajectory_id: str | None, body: object, now: float | None = None) -> PauseStart | None:
        """A non-streaming response of ``trajectory_id``'s request ended (``body``:
        its parsed JSON).  None: a trajectory we do not track.  Never raises."""
        now = self._clock() if now is None else float(now)
        with self._lock:
            try:
                calls = tool_calls_of_response(body)
            except Exception as exc:
                self._failed("response", exc)
                calls = ()
            try:
                return self._ended(trajectory_id, calls, usage_tokens(body), now)
            except Exception as exc:
                self._failed("response", exc)
                return None

    def stream(self, trajectory_id: str | None) -> "StreamWatch":
        """A reader of ``trajectory_id``'s streamed response (see :class:`StreamWatch`)."""
        return StreamWatch(trajectory_id, on_named=self._named, on_end=self._stream_ended, on_error=self._stream_failed)

    def _stream_failed(self, exc: Exception) -> None:
        with self._lock:
            self._failed("stream", exc)

    def _stream_ended(self, tid: str | None, calls: tuple[ToolCall, ...], tokens: int | None,
                      now: float | None) -> PauseStart | None:
        now = self._clock() if now is None else float(now)
        with self._lock:
            try:
                return self._ended(tid, calls, tokens, now)
            except Exception as exc:
                self._failed("stream", exc)
                return None

    def _named(self, tid: str | None, calls: tuple[ToolCall, ...]) -> None:
        """A stream named its first tool: learn the transition now."""
        with self._lock:
            t = self._trajs.get(tid) if tid is not None else None
            if t is None or t.turn is None or t.turn.learned or not calls:
                return
            t.turn.calls = calls
            t.turn.learned = True
            self.forecaster.observe(t.agent, tid, t.turn.last, calls[0].name)
            self.counters["named_early"] += 1

    def _ended(self, tid: str | None, calls: tuple[ToolCall, ...], tokens: int | None,
               now: float) -> PauseStart | None:
        t = self._trajs.get(tid) if tid is not None else None
        if t is None or t.turn is None:
            return None
        turn = t.turn
        if calls:
            turn.calls = calls
            if not turn.learned:
                turn.learned = True
                self.forecaster.observe(t.agent, tid, turn.last, calls[0].name)
        turn.ended_at = now
        if tokens is not None:
            t.context_tokens = tokens
        self.counters["responses"] += 1
        return PauseStart(tid, turn.forecast, turn.calls[0].name if turn.calls else None)

    def retag(self, trajectory_id: str | None) -> Retag | None:
        """The correction the engine needs for ``trajectory_id``'s current turn, asked
        once the response's first tool is parsed (after each piece of a stream that
        names one, and at its end): a :class:`~.hint.Retag` when that tool is not the
        hint's forecast.  None: nothing parsed yet, nothing to correct, a turn the
        client hinted itself, or asked before (one answer per turn).  Never raises."""
        with self._lock:
            t = self._trajs.get(trajectory_id) if trajectory_id is not None else None
            turn = t.turn if t is not None else None
            if turn is None or not turn.hinted or turn.retag_asked or not turn.calls:
                return None
            turn.retag_asked = True
            tool = turn.calls[0].name
            if tool == turn.forecast:
                return None
            self.counters["retags"] += 1
            return Retag(trajectory_id, tool, turn.forecast)

    # -- bookkeeping
    def _failed(self, where: str, exc: Exception) -> None:
        self.counters[f"rejected:{where}"] += 1
        msg = str(exc)
        self.last_error = f"{where}: {type(exc).__name__}: {msg[:200]}"
        log.debug("conversation hints: %s", self.last_error)

    def stats(self) -> dict[str, object]:
        """Counters (requests, forecast sources, observations, forecast_correct,
        rejected:<where>, ...), what is held, and the last error."""
        with self._lock:
            return {**self.counters, "trajectories": len(self._trajs), "branches": len(self.namer),
                    **{f"forecaster_{k}": v for k, v in self.forecaster.sizes().items()},
                    "last_error": self.last_error}


class StreamWatch:
    """One streamed response passing through the router: :meth:`feed` each
    piece of its bytes (answers the tool names completed in it; the first one
    is learned at once), :meth:`end` when it ends.  Never raises.  One stream,
    one caller; made by :meth:`ConversationHints.stream`, whose callbacks it
    calls (they take the owner's lock)."""

    def __init__(self, trajectory_id: str | None, *, on_named: Callable[[str | None, tuple[ToolCall, ...]], None],
                 on_end: Callable[..., PauseStart | None], on_error: Callable[[Exception], None]) -> None:
        self._tid = trajectory_id
        self._on_named, self._on_end, self._on_error = on_named, on_end, on_error
        self._sse = ToolCallStream()
        self._ended = False

    def feed(self, data: bytes) -> tuple[str, ...]:
        if isinstance(data, str):
            data = data.encode("utf-8", "replace")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            self._on_error(TypeError(f"stream bytes expected, got {type(data).__name__}"))
            return ()
        new = self._sse.feed(bytes(data))
        if new:
            self._on_named(self._tid, self._sse.named())
        return new

    def end(self, now: float | None = None) -> PauseStart | None:
        """The stream ended (at ``now``): its pause starts.  A second call is a no-op (None)."""
        if self._ended:
            return None
        self._ended = True
        return self._on_end(self._tid, self._sse.calls(), self._sse.usage_tokens, now)
