"""Persistent-grid tile counts the warp-specialized GPU tests cover (issue 6): 1, #SMs−1, #SMs, #SMs+1, 2·#SMs+3."""

import torch

from lowrank_gemm.kernels.schedule import num_sms

TILE_COUNT_CASES = ["1", "sms-1", "sms", "sms+1", "2sms+3"]


def tile_count(which: str) -> int:
    sms = num_sms(torch.device("cuda"))
    return {"1": 1, "sms-1": sms - 1, "sms": sms, "sms+1": sms + 1, "2sms+3": 2 * sms + 3}[which]
