"""Cluster launch scripts (stdlib only): `python -m launch.tpu_vm`, `python -m launch.gpu`."""
