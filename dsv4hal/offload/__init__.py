"""A C4 compressed-KV pool kept in host memory with a GPU working set (dsv4hal.offload.pool)."""
