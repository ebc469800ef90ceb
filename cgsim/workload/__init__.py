"""What create_forward_fn needs, for any target: a toy model whose outputs
depend on attention metadata, attention backends at each support level,
metadata lifetime tracking and an eager reference."""

from cgsim.workload.attention import ATTENTION_BACKENDS, AttentionBackendSpec, AttentionMetadata, MetadataBuilder, backend_for
from cgsim.workload.context import ForwardContext, get_forward_context, set_forward_context
from cgsim.workload.harness import OUTPUT_TOLERANCE, EagerForward, PiecewiseRunner, RequestLayout, Workload

__all__ = [
    "ATTENTION_BACKENDS", "AttentionBackendSpec", "AttentionMetadata", "MetadataBuilder", "backend_for",
    "ForwardContext", "get_forward_context", "set_forward_context",
    "OUTPUT_TOLERANCE", "EagerForward", "PiecewiseRunner", "RequestLayout", "Workload",
]
