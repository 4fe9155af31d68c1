"""Tests of the embedded local model (kitune.localmodel, kitune lm)."""
