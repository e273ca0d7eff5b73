"""Drop-in modules: one adapter (:class:`LoRALinear`), a bank of adapters (:class:`MultiLoRALinear`),
and SVDQuant W4A4 layers (:class:`SVDQLinear`); plus the model transforms that install them, and tensor
parallelism over torch.distributed (:mod:`.parallel`: :class:`ColumnParallel`, :class:`RowParallel`,
:func:`parallelize_`)."""

from .lora import LoRALinear
from .multilora import AdapterBank, MultiLoRALinear
from .svdq import SVDQLinear, W8A8Linear
from .parallel import ColumnParallel, RowParallel, parallelize_
from ..integrations.peft import fuse_lora_

__all__ = ["LoRALinear", "MultiLoRALinear", "AdapterBank", "SVDQLinear", "W8A8Linear", "fuse_lora_",
           "ColumnParallel", "RowParallel", "parallelize_"]
