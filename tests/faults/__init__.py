"""The fault matrix: each fault injected for real, and what multihost must do about it."""
