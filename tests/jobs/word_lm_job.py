"""pytorch/examples word_language_model's training loop, tiny, under the shim (doctor tests).

A small LSTM LM over a synthetic corpus batchified into columns, cut into bptt-long pieces; the
hidden state is carried from one piece to the next and detached (repackage_hidden); plain SGD by
hand with gradient clipping, like the original. `declared`: the carried hidden state lives in
run.state, so a mid-epoch resume continues it; `forgotten`: it is a loop variable the checkpoint
does not hold, so a resume restarts it at zeros (the original script's state after a restart).
"""
import sys

import torch
from torch import nn

import trainer_shim

mode = sys.argv[1]
VOCAB, BSZ, BPTT, LR, CLIP = 50, 4, 10, 2.0, 0.25
torch.manual_seed(1111)


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int = 16, nhid: int = 32, dropout: float = 0.2) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 1)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out)).view(-1, VOCAB), hidden

    def init_hidden(self, bsz: int):
        w = next(self.parameters())
        return (w.new_zeros(1, bsz, self.nhid), w.new_zeros(1, bsz, self.nhid))


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int):
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


corpus = torch.randint(0, VOCAB, (640,), generator=torch.Generator().manual_seed(7))
train_data = batchify(corpus, BSZ)          # 160 rows: 16 pieces of BPTT per epoch
model = RNNModel(VOCAB)
criterion = nn.CrossEntropyLoss()

run = trainer_shim.init(model=model, save_every_steps=5)
for epoch in run.epochs(100):
    model.train()
    if mode == "declared" and run.batch_in_epoch > 0:
        hidden = run.state["hidden"]         # resumed mid-epoch: continue the carried state
    else:
        hidden = model.init_hidden(BSZ)
    for i in run.batches(list(range(0, train_data.size(0) - 1, BPTT))):
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-LR)
        if mode == "declared":
            run.state["hidden"] = repackage_hidden(hidden)
        run.step(loss=loss.item())
run.finish()
