"""Measurement code for holding ftplan's formulas against real PyTorch.

Importing this package imports nothing heavy: torch, transformers and peft are imported only by the
submodules that need them (e.g. :mod:`ftplan.measure.torchref`).
"""
