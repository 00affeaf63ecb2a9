"""Per-tool hints for agents that send none, read from the OpenAI chat traffic itself.

A router in front of engines calls :class:`ConversationHints` on each chat
request and response: it names the trajectory (:mod:`.naming`), reads the
tool calls of responses, JSON or streamed (:mod:`.messages`, :mod:`.sse`),
learns each tool's waits and which tool follows which (:mod:`.next_tool`),
and adds kvtier's hint to the request (:mod:`.hint`).  How the hint's tool
is chosen before the response names it: :mod:`.tracker`; docs/conversation-hints.md.
Imports only :mod:`kvtier.tiering.forecasting`.
"""
from .hint import Retag, make_hint, with_hint
from .messages import ChatRequest, ConversationError, ToolCall, read_request, tool_calls_of_response
from .naming import Names, TrajectoryNamer
from .next_tool import NextTool, NextToolForecaster
from .sse import ToolCallStream
from .tracker import ConversationHints, Forwarded, Observation, PauseStart, StreamWatch

__all__ = ["ConversationHints", "Forwarded", "Observation", "PauseStart", "StreamWatch", "ToolCallStream",
           "TrajectoryNamer", "Names", "NextToolForecaster", "NextTool", "ChatRequest", "ToolCall",
           "ConversationError", "read_request", "tool_calls_of_response", "make_hint", "with_hint", "Retag"]
