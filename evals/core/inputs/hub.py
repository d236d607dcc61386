"""The Hugging Face hub, asked in one place: is it reachable, is a repository cached, and the one error a user
reads when a hub model can be had neither way. Nothing else in rope_ext opens a connection to it."""

from __future__ import annotations

import os

from ..errors import UserError


class ModelLoadError(UserError):
    """The model or tokenizer cannot be found, read or placed; the message says what to set."""


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connect within ``timeout`` (False when HF_HUB_OFFLINE)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def hub_cached(repo_id: str, filename: str = "config.json") -> str | None:
    """The cached path of a hub file (its snapshot directory names the revision), or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename)
    return found if isinstance(found, str) else None


def hub_hint(cfg) -> str:
    return (
        f"model '{cfg.name}' ({cfg.hub_id}) could not be loaded from the Hugging Face hub (offline, gated "
        f"or missing). Download it elsewhere and set model.path=/path/to/checkpoint, or run with "
        f"model.weights=random for its shape with random weights"
    )


def require_hub(cfg) -> None:
    """Fail in seconds, not after the hub client's retries, when a hub model is neither cached nor reachable."""
    if not cfg.hub_id:
        raise ModelLoadError(
            f"model '{cfg.name}' has no path, gguf_package or hub_id: set model.path=/path/to/checkpoint"
        )
    if not hub_cached(cfg.hub_id) and not hub_reachable():
        raise ModelLoadError(hub_hint(cfg))
