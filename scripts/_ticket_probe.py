"""Shared part of session 47's ticket probes (probe_ml_tickets.py, probe_lora_sync.py): a call as it ran before the
shared ticket region, with ``lora_gemm._TICKETS`` swapped for a stand-in that zeroes a fresh buffer per call (a
memset node in every captured graph)."""

from __future__ import annotations

import torch


class PerCallTickets:
    """``_Tickets.get``'s signature, a fresh ``torch.zeros`` each time."""

    def get(self, device, tiles):
        return torch.zeros(tiles, dtype=torch.int32, device=device)


def with_per_call_tickets(fn):
    """``fn`` run with a zeroed ticket buffer per call instead of the shared region (the region is put back after)."""
    from lowrank_gemm.kernels import lora_gemm

    def call(*args):
        shared = lora_gemm._TICKETS
        lora_gemm._TICKETS = PerCallTickets()
        try:
            return fn(*args)
        finally:
            lora_gemm._TICKETS = shared
    return call
