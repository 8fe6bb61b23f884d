"""What a create charges against quota: 1 object of its resource plus `requests.cpu`
(in millicores) and `requests.memory` (in bytes) summed from the container requests in
its body (units and the tracked-resource table: `sidecar/core/quantities.py`). Whatever the
body holds, the result is a charge of integers of at most MAX_UNITS each, or a
QuantityError (the caller's 400).
"""

from __future__ import annotations

from typing import Any

from sidecar.core.quantities import CPU, MAX_UNITS, MEMORY, QuantityError, to_units

Charge = dict[str, int]
# `spec.replicas` is an int32 in the Kubernetes API types.
MAX_REPLICAS = 2**31 - 1


def charge_for(resource: str, body: Any) -> Charge:
    """The charge of creating one object: 1 of `resource`, plus the cpu/memory requests
    of its containers (`spec.containers`, and `spec.template.spec.containers` times
    `spec.replicas` for workload templates). Raises QuantityError on a bad request."""
    charge: Charge = {resource: 1}
    cpu = 0
    memory = 0
    spec = body.get("spec") if isinstance(body, dict) else None
    if isinstance(spec, dict):
        groups: list[tuple[Any, int]] = [(spec.get("containers"), 1)]
        template = spec.get("template")
        if isinstance(template, dict) and isinstance(template.get("spec"), dict):
            replicas = spec.get("replicas", 1)
            if (
                isinstance(replicas, bool)
                or not isinstance(replicas, int)
                or not 0 <= replicas <= MAX_REPLICAS
            ):
                raise QuantityError(f"spec.replicas must be an integer from 0 to {MAX_REPLICAS}")
            groups.append((template["spec"].get("containers"), replicas))
        for containers, times in groups:
            c, m = _sum_requests(containers)
            cpu += c * times
            memory += m * times
    for resource, amount in ((CPU, cpu), (MEMORY, memory)):
        if amount > MAX_UNITS:
            raise QuantityError(f"the total {resource} of the object is too large")
        if amount:
            charge[resource] = amount
    return charge


def _sum_requests(containers: Any) -> tuple[int, int]:
    if containers is None:
        return 0, 0
    if not isinstance(containers, list):
        raise QuantityError("containers must be a list")
    cpu = memory = 0
    for i, container in enumerate(containers):
        if not isinstance(container, dict):
            raise QuantityError(f"containers[{i}] must be an object")
        resources = container.get("resources") or {}
        requests = resources.get("requests") if isinstance(resources, dict) else None
        if requests is None:
            continue
        if not isinstance(requests, dict):
            raise QuantityError(f"containers[{i}].resources.requests must be an object")
        try:
            if "cpu" in requests:
                cpu += to_units(CPU, requests["cpu"])
            if "memory" in requests:
                memory += to_units(MEMORY, requests["memory"])
        except QuantityError as exc:
            raise QuantityError(f"containers[{i}].resources.requests: {exc}") from None
    return cpu, memory
