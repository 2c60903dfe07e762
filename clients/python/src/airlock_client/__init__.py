"""Client for airlock, a sandbox service that runs untrusted Python and returns JSON results."""

from airlock_client.decode import DataFrame, DecodeError, Repr, Series, decode

__all__ = ["DataFrame", "DecodeError", "Repr", "Series", "decode"]
