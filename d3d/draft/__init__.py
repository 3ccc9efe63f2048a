"""Drafters: the D3D block-diffusion drafter (tokens only) and the DFlash baseline (target hidden states)."""
