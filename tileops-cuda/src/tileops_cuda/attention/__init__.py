"""Attention kernels: torch's SDPA backends as vendor kernels and TileLang's (see `kernels`)."""
