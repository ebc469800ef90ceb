"""Import-time stand-in for zmq.

Needed by: sglang/srt/utils/network.py (`import zmq`, type hints zmq.Socket / zmq.Context)
and the scheduler/tokenizer IPC modules on the import chain (zmq.asyncio).
Why a stand-in suffices: ZeroMQ carries messages between sglang's server processes;
the graph runners run in one process and never open a socket.
"""
from _cgsim_standin import install

install(__name__)
