"""Methods mixed into vLLM's workers (vLLM's `worker_extension_cls`).

The backend identity needs the attention backend the engine actually selected,
which only the worker process knows; `collective_rpc` calls these by name.
"""

from __future__ import annotations

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


WORKER_EXTENSION = f"{__name__}.{BackendIntrospection.__name__}"
