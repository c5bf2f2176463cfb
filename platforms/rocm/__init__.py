"""dsv4hal."""
