"""The Gavel model families written out in plain PyTorch, with a synthetic training step, for
benchmarks/gpu_colocation.py (no torchvision, no data loading: inputs are random tensors on the device).

Optimizers and their state copies are those of meshsched/perf/assumptions.py CHECKPOINTS, so the
measured memory is of the job the simulator's memory model assumes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's meshsched, installed or not
from meshsched.perf.assumptions import CHECKPOINTS  # noqa: E402

CHECKPOINT = {c.model: c for c in CHECKPOINTS}


class Basic(nn.Module):
    expansion = 1

    def __init__(self, cin, c, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, c, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(c)
        self.sc = nn.Sequential()
        if stride != 1 or cin != c:
            self.sc = nn.Sequential(nn.Conv2d(cin, c, 1, stride, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        out = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(out)) + self.sc(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, c, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, c, 1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, stride, 1, bias=False)
        self.b2 = nn.BatchNorm2d(c)
        self.c3 = nn.Conv2d(c, c * 4, 1, bias=False)
        self.b3 = nn.BatchNorm2d(c * 4)
        self.sc = nn.Sequential()
        if stride != 1 or cin != c * 4:
            self.sc = nn.Sequential(nn.Conv2d(cin, c * 4, 1, stride, bias=False), nn.BatchNorm2d(c * 4))

    def forward(self, x):
        out = F.relu(self.b1(self.c1(x)))
        out = F.relu(self.b2(self.c2(out)))
        return F.relu(self.b3(self.c3(out)) + self.sc(x))


class ResNet(nn.Module):
    """`stem`, four stages of `block` with `depths` (widths 64-512, stride 2 after the first), pool, linear."""

    def __init__(self, stem: nn.Module, block, depths: tuple[int, int, int, int], classes: int):
        super().__init__()
        self.stem = stem
        stages, cin = [], 64
        for i, (c, n) in enumerate(zip((64, 128, 256, 512), depths)):
            for s in [1 if i == 0 else 2] + [1] * (n - 1):
                stages.append(block(cin, c, s))
                cin = c * block.expansion
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1), 1))


def resnet18_cifar() -> ResNet:  # kuangliu/pytorch-cifar ResNet18, as Gavel's CIFAR-10 job (11.17M)
    return ResNet(nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()), Basic, (2, 2, 2, 2), 10)


def resnet50() -> ResNet:  # torchvision resnet50 layout (25,557,032 parameters)
    stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    return ResNet(stem, Bottleneck, (3, 4, 6, 3), 1000)


class LSTMLM(nn.Module):  # PyTorch word_language_model, WikiText-2: emb/hidden 200, 2 layers
    def __init__(self, vocab=33278, d=200):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, 2, dropout=0.2)
        self.drop = nn.Dropout(0.2)
        self.dec = nn.Linear(d, vocab)

    def forward(self, x):
        out, _ = self.rnn(self.drop(self.emb(x)))
        return self.dec(self.drop(out))


class Seq2Seq(nn.Module):  # Transformer base on Multi30k de->en
    def __init__(self, vs=7853, vt=5893, d=512):
        super().__init__()
        self.se = nn.Embedding(vs, d)
        self.te = nn.Embedding(vt, d)
        self.pos = nn.Parameter(torch.zeros(1, 64, d), requires_grad=False)
        self.tf = nn.Transformer(d, 8, 6, 6, 2048, 0.1, batch_first=True)
        self.gen = nn.Linear(d, vt)

    def forward(self, src, tgt):
        n = tgt.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=tgt.device), 1)
        s = self.se(src) + self.pos[:, : src.shape[1]]
        t = self.te(tgt) + self.pos[:, :n]
        return self.gen(self.tf(s, t, tgt_mask=mask))


class VAECF(nn.Module):  # Liang et al. 2018 Mult-VAE, 20,108 items, 600-200
    def __init__(self, items=20108):
        super().__init__()
        self.e1 = nn.Linear(items, 600)
        self.e2 = nn.Linear(600, 400)
        self.d1 = nn.Linear(200, 600)
        self.d2 = nn.Linear(600, items)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = torch.tanh(self.e1(self.drop(F.normalize(x))))
        mu, logvar = self.e2(h).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.d2(torch.tanh(self.d1(z))), mu, logvar


def build(model: str, batch: int, device):
    """(module, optimizer, step(accumulation) -> None, parameter count, optimizer name) for `batch` samples."""
    torch.manual_seed(0)
    if model in ("resnet18", "cifar10", "resnet50", "imagenet"):
        small = model in ("resnet18", "cifar10")
        net = resnet18_cifar() if small else resnet50()
        side, classes = (32, 10) if small else (224, 1000)
        x = torch.randn(batch, 3, side, side, device=device)
        y = torch.randint(0, classes, (batch,), device=device)

        def loss_fn(m):
            return F.cross_entropy(m(x), y)
    elif model == "lm":
        net = LSTMLM()
        x = torch.randint(0, 33278, (35, batch), device=device)
        y = torch.randint(0, 33278, (35, batch), device=device)

        def loss_fn(m):
            return F.cross_entropy(m(x).view(-1, 33278), y.view(-1))
    elif model == "transformer":
        net = Seq2Seq()
        src = torch.randint(0, 7853, (batch, 30), device=device)
        tgt = torch.randint(0, 5893, (batch, 31), device=device)

        def loss_fn(m):
            return F.cross_entropy(m(src, tgt[:, :-1]).reshape(-1, 5893), tgt[:, 1:].reshape(-1))
    elif model == "recommendation":
        net = VAECF()
        x = (torch.rand(batch, 20108, device=device) < 0.01).float()

        def loss_fn(m):
            logits, mu, logvar = m(x)
            nll = -(F.log_softmax(logits, 1) * x).sum(1).mean()
            kl = -0.5 * torch.mean(torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=1))
            return nll + 0.2 * kl
    else:
        raise ValueError(model)
    net = net.to(device).train()
    opt_name = CHECKPOINT[model].optimizer
    params = [p for p in net.parameters() if p.requires_grad]
    if opt_name == "adam":
        opt = torch.optim.Adam(params, lr=1e-4)
    elif opt_name == "sgd+momentum":
        opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.SGD(params, lr=0.1)

    def step(accum: int = 1) -> None:
        opt.zero_grad(set_to_none=True)
        for _ in range(accum):
            (loss_fn(net) / accum).backward()
        if model == "lm":
            torch.nn.utils.clip_grad_norm_(params, 0.25)
        opt.step()

    return net, opt, step, sum(p.numel() for p in params), opt_name
