"""Import-time stand-in for yaml.

Needed by: sglang/srt/multiplex/pdmux_context.py (`import yaml`), imported by the decode
runner (get_current_stream_idx / get_stream_groups).
Why a stand-in suffices: yaml only reads the PD-multiplexing config file, used when
enable_pdmux is on; cgsim keeps it off.
"""
from _cgsim_standin import install

install(__name__)
