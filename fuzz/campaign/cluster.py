"""The Ray cluster a ``--ray`` campaign runs on: ``connect`` to it and
``join_cluster`` (the run's options on it), called where the campaign
starts (``fuzz.campaign.run``), never at validation.

``connect``: ``auto`` is the cluster this machine belongs to (also through
``RAY_ADDRESS``); ``local`` a one-machine Ray started for this campaign and
stopped with it; else a GCS address ``HOST:PORT``.  Ray Client (``ray://``)
is refused (``options.check_ray_address``, also at validation): its driver
runs off the cluster, and the findings must be written on the machine that
holds the report.  A process that already called ``ray.init`` keeps its
connection.  Ray is imported only here and by the executor that runs on it
(``ray_executor``), so a campaign without ``--ray`` never needs it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from cgsim.text import first_line
from fuzz.campaign.options import CampaignOptions, UsageError, check_ray_address

__all__ = ["Node", "Cluster", "connect", "join_cluster", "MISSING_RAY"]

MISSING_RAY = "--ray needs Ray, which is not installed here: pip install 'cgsim[ray]' (or pip install ray)"


@dataclass(frozen=True)
class Node:
    node_id: str
    host: str
    ip: str
    cpus: int
    gpus: int


@dataclass(frozen=True)
class Cluster:
    address: str
    nodes: tuple[Node, ...]
    driver_node: str  # the node id of this process's machine
    opened: bool  # connect() called ray.init (and shutdown calls ray.shutdown)

    @property
    def cpus(self) -> int:
        return sum(n.cpus for n in self.nodes)

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def describe(self) -> str:
        return f"{len(self.nodes)} node(s), {self.cpus} CPU(s), {self.gpus} GPU(s)"

    def settings(self) -> dict:
        return {"address": self.address, "nodes": len(self.nodes), "cpus": self.cpus, "gpus": self.gpus}


def connect(address: str, quiet: bool = False) -> Cluster:
    """The cluster at ``address`` (see the module docstring), or UsageError."""
    try:
        import ray
    except ImportError:
        raise UsageError(MISSING_RAY) from None
    check_ray_address(address)
    opened = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"logging_level": logging.ERROR if quiet else logging.WARNING,
                                  "log_to_driver": not quiet}
        if address == "local":
            kwargs["include_dashboard"] = False
        try:
            ray.init(address=address, **kwargs)
        except ConnectionError as exc:
            if address == "auto":
                raise UsageError("--ray auto: no Ray cluster is running on this machine (start one with ray start "
                                 "--head, join one with ray start --address=HEAD:6379, or use --ray local for a "
                                 "one-machine Ray)") from None
            raise UsageError(f"--ray {address}: cannot connect ({first_line(exc)}); give the head's HOST:PORT "
                             "(ray start --head prints it), auto or local") from None
        except Exception as exc:
            raise UsageError(f"--ray {address}: Ray did not start ({type(exc).__name__}: {first_line(exc)})") from None
        opened = True
    nodes = tuple(sorted(
        (Node(n["NodeID"], n.get("NodeManagerHostname") or n.get("NodeManagerAddress", "?"),
              n.get("NodeManagerAddress", "?"), int(n.get("Resources", {}).get("CPU", 0)),
              int(n.get("Resources", {}).get("GPU", 0)))
         for n in ray.nodes() if n.get("Alive")), key=lambda n: (n.host, n.node_id)))
    return Cluster(address, nodes, ray.get_runtime_context().get_node_id(), opened)


def join_cluster(o: CampaignOptions) -> CampaignOptions:
    """Validated options with ``--ray``, on the cluster they name: connected
    (``connect``), with one worker per CPU of the cluster (per GPU with
    ``--backend cuda``) without ``--workers``, else at most that many; or
    UsageError (one line).  Called where the campaign starts, after
    ``options.validate``."""
    cluster = connect(o.ray, quiet=o.quiet)
    capacity = cluster.gpus if o.backend == "cuda" else cluster.cpus
    what = "GPU" if o.backend == "cuda" else "CPU"
    if capacity < 1:
        raise UsageError(f"--ray {o.ray}: the cluster has no {what} for a worker ({cluster.describe()}); "
                         + ("add GPU nodes (ray start --address=... on a GPU machine)" if what == "GPU"
                            else "add nodes with CPUs"))
    workers = o.workers
    if o.workers_from_cluster:
        workers = capacity
    elif o.workers > capacity:
        raise UsageError(f"--workers {o.workers} with --ray: the cluster has {capacity} {what}(s) "
                         f"({cluster.describe()}), one per worker; give at most {capacity} or leave --workers out")
    return o.with_(workers=workers, cluster=cluster)
