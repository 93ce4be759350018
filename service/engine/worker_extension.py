"""Methods mixed into vLLM's workers (vLLM's `worker_extension_cls`).

The backend identity needs facts only the worker processes know: the attention
backend the engine actually selected, and the device each worker runs on (with
data parallelism, every rank is its own engine core with its own workers, and
its own GPU). `collective_rpc` calls these by name.
"""

from __future__ import annotations

import os
from typing import Any


class BackendIntrospection:
    """Read-only questions a gateway may ask each worker."""

    def moss_attention_backends(self) -> list[str]:
        runner: Any = getattr(self, "model_runner", None)
        names: set[str] = set()
        for groups in getattr(runner, "attn_groups", None) or []:
            for group in groups:
                names.add(str(group.backend.get_name()))
        return sorted(names)

    def moss_device(self) -> dict[str, Any]:
        """This worker's device: kind, index, name, and the GPU's UUID and bus ID.

        The rank is not asked here: for a dense model vLLM runs every data-parallel
        rank's workers as a world of one (each says "DP rank 0"); the caller knows
        the rank from the engine core it addressed. The index is torch's (within
        the devices this process sees); `visible` is the CUDA/HIP_VISIBLE_DEVICES
        the rank's process got, which maps it to the host's GPU numbering.
        """
        import torch

        device: Any = getattr(self, "device", None)
        facts: dict[str, Any] = {"kind": str(getattr(device, "type", "cpu"))}
        if facts["kind"] == "cuda" and torch.cuda.is_available():
            index = device.index if device.index is not None else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            facts.update(
                index=int(index),
                name=str(props.name),
                uuid=str(getattr(props, "uuid", "")) or None,
                pci_bus_id=getattr(props, "pci_bus_id", None),
                visible=os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("HIP_VISIBLE_DEVICES"),
            )
        else:
            facts.update(index=None, name="cpu", uuid=None, pci_bus_id=None, visible=None)
        return facts


WORKER_EXTENSION = f"{__name__}.{BackendIntrospection.__name__}"
