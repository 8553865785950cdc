"""Sharding sweeps: grids and --where, the sweep runner, results and charts."""
