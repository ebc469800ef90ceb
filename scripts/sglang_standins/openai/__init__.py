"""Import-time stand-in for openai.

Needed by: sglang/srt/entrypoints/openai/protocol.py (`from openai.types.responses
import ...`, used as pydantic field types and TypedDict bases), reached via
schedule_batch -> constrained/base_grammar_backend -> parser/reasoning_parser.
Why a stand-in suffices: the OpenAI-compatible HTTP API's request/response types;
the runners never build one. (The real openai==2.8.0 pulls in httpx, anyio, jiter,
distro, ...)
"""
from _cgsim_standin import install

install(__name__)
