"""A graph an earlier scenario left as garbage, collected by Python's GC in
the middle of a capture, invalidates that capture (the mock does what an
H200 did).  The engines' runners hold GC off while they capture; so must the
runner cgsim drives its own encoder managers with, or a campaign that reuses
its process reports an ENC-NO-CRASH no manager caused."""

from __future__ import annotations

import gc

import pytest
import torch

from cgsim.backends import get_backend
from cgsim.encoder.mutants import ENCODER_MUTANTS
from cgsim.encoder.toy import ToyVisionEncoder
from cgsim.encoder.strategies import judge_encoder


def _stale_graph_in_a_cycle(cuda) -> None:
    """A captured graph only the cyclic collector can free."""
    graph = cuda.CUDAGraph()
    x = torch.zeros(4)
    with cuda.graph(graph):
        x.add_(1)
    holder: list = [graph]
    holder.append(holder)


@pytest.mark.parametrize("target", ["encoder-reference", "encoder-mutant:stale-tail"])
def test_a_garbage_graph_the_collector_would_free_during_an_encoder_capture_is_no_finding(target, monkeypatch):
    backend = get_backend("mock")
    forward = ToyVisionEncoder.encoder_cudagraph_forward

    def forward_allocating_enough_to_collect(self, values, path="default"):
        # What an allocation past the threshold does inside a capture while automatic collection is on.
        if gc.isenabled() and torch.cuda.is_current_stream_capturing():
            gc.collect()
        return forward(self, values, path)

    monkeypatch.setattr(ToyVisionEncoder, "encoder_cudagraph_forward", forward_allocating_enough_to_collect)
    with backend.activate():
        _stale_graph_in_a_cycle(backend.cuda)
    verdict = judge_encoder(target, ENCODER_MUTANTS["stale-tail"].example(), backend)
    assert "ENC-NO-CRASH" not in {v.property for v in verdict.violations}, [str(v) for v in verdict.violations]
