"""The README's example: a plain PyTorch loop made resumable with five trainer_shim calls."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer_shim

torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
loader = DataLoader(data, batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)

run = trainer_shim.init(model=model, optimizer=opt, scheduler=sched, save_every_steps=10)
for epoch in run.epochs(5):
    for x, y in run.batches(loader):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        run.step(loss=loss.item())
    sched.step()
run.finish()
torch.save(model.state_dict(), run.rd.root / "final_weights.pt")
