"""Import-time stand-in for partial_json_parser.

Needed by: sglang/srt/function_call/base_format_detector.py (`from
partial_json_parser.core.exceptions import MalformedJSON`), reached via
schedule_batch -> grammar backend -> function-call parsers.
Why a stand-in suffices: parses streamed tool-call JSON in API responses; no text is
generated or parsed by the runners.
"""
from _cgsim_standin import install

install(__name__)
