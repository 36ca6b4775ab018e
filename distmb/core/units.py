"""Sizes of what is stored and sent, in bytes (named once, used by traffic counters)."""

#: One float32 value (feature or embedding entry).
FLOAT32_BYTES = 4
#: One vertex id, count or degree on the wire (int64).
ID_BYTES = 8


def row_message_bytes(dim: int) -> int:
    """One (``VID_o``, float32[dim] row) message: the unit of embedding pushes and of an
    exact pull of halo rows."""
    return ID_BYTES + FLOAT32_BYTES * dim
