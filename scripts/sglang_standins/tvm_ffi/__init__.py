"""Import-time stand-in for tvm_ffi.

Needed by: sglang/kernels/ops/communication/all_reduce.py (`import tvm_ffi`) and the JIT
kernel modules under sglang/kernels/ops (`from tvm_ffi.module import Module`, type
hints), imported by the parallel-state / memory-pool modules the runners import.
Why a stand-in suffices: apache-tvm-ffi loads sglang's JIT-compiled CUDA kernels;
none is built or called on CPU.
"""
from _cgsim_standin import install

install(__name__)
