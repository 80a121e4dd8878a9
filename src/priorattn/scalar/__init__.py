"""Scalar sort attention (seed 002): scalar Gaussian-kernel and hybrid attention, sorted-cache decoding."""
