"""Small models shared by the PEFT tests."""

from torch import nn


class Tiny(nn.Module):
    """Two linears around a GELU: enough for PEFT to wrap ``up`` and ``down``."""

    def __init__(self, k=48, h=40, n=24):
        super().__init__()
        self.up = nn.Linear(k, h, bias=True)
        self.act = nn.GELU()
        self.down = nn.Linear(h, n, bias=False)

    def forward(self, x):
        return self.down(self.act(self.up(x)))
