"""A training loop whose model is three modules it calls in turn (#32 item 2): an embedding, a body
(nn.TransformerEncoder, 4 layers) and a head, one optimizer over all three. A frozen teacher (trainable
parameters, never optimized) and an EMA copy of the body are alive beside them and are not the model.
``--container``: the three are one module's parts, which the loop calls and never the module itself (a
LightningModule's training_step calling ``self.net(x)``)."""

from __future__ import annotations

import argparse
import copy

import torch
from torch import nn

import autotune

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--steps", type=int, default=1000)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--d-model", type=int, default=128)
p.add_argument("--container", action="store_true")
args = p.parse_args()
batch = autotune.batch_size(args.batch_size)

torch.manual_seed(0)
vocab = 500
emb = nn.Embedding(vocab, args.d_model)
layer = nn.TransformerEncoderLayer(args.d_model, 4, 4 * args.d_model, dropout=0.0, batch_first=True)
body = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
head = nn.Linear(args.d_model, vocab)
teacher = nn.Sequential(nn.Linear(args.d_model, args.d_model), nn.Linear(args.d_model, args.d_model))
ema = copy.deepcopy(body)  # trainable parameters, not in the optimizer
if args.container:
    model = nn.Module()
    model.emb, model.body, model.head = emb, body, head
    params = list(model.parameters())
else:
    params = [*emb.parameters(), *body.parameters(), *head.parameters()]
optimizer = torch.optim.AdamW(params, lr=1e-3)
loss_fn = nn.CrossEntropyLoss()

for step in range(args.steps):
    tokens = torch.randint(0, vocab, (batch, args.seq))
    with torch.no_grad():
        teacher(torch.zeros(1, args.d_model))  # runs first each step, never trained
    logits = head(body(emb(tokens)))
    loss = loss_fn(logits.reshape(-1, vocab), tokens.roll(-1, 1).reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    with torch.no_grad():
        for e, b in zip(ema.parameters(), body.parameters(), strict=True):
            e.lerp_(b, 0.01)
    print(f"step {step} loss {loss.item():.4f}", flush=True)
