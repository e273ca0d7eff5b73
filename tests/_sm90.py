"""ptxas on an ahead-of-time compiled kernel (sm_90a): registers and spills, as launched kernels would get them."""

import os
import re
import subprocess
import tempfile


def ptxas_stats(ptx: str):
    """(registers, spill-store bytes, ptxas stderr) of ``ptx`` for sm_90a, or None without triton's ptxas."""
    import triton
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(exe):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "k.ptx"), "w") as f:
            f.write(ptx)
        log = subprocess.run([exe, "-arch=sm_90a", "-v", os.path.join(tmp, "k.ptx"), "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True).stderr
    regs = [int(v) for v in re.findall(r"Used (\d+) registers", log)]
    spills = [int(v) for v in re.findall(r"(\d+) bytes spill stores", log)]
    return max(regs), max(spills or [0]), log
