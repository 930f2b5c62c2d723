#!/usr/bin/env python3
"""Train the Fashion-MNIST classifier that tools/eval_default.py scores generated images with.

What it is: a small CNN (two 3x3 conv pairs with batch norm, max pooling, a 128-unit
hidden layer; about 0.47 M parameters) trained on the 60,000 Fashion-MNIST training
images from Debian's dataset-fashion-mnist package, on one CPU thread, for a few
minutes. Inputs are 28x28 grayscale in [-1, 1], the range ditd's pixel models produce
(PNG value / 127.5 - 1). Augmentation: random shifts of up to 2 pixels (no flips:
Fashion-MNIST's shoes all face left). It reports the test-set accuracy (10,000
images), overall and per class, and saves the weights (fp16, about 1 MB) to
tools/fashion_classifier.pt.

    python tools/train_classifier.py [--epochs 4] [--out tools/fashion_classifier.pt]

Other scripts import Net, load_classifier and classify from here.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_default import CLASSES, load_split  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "fashion_classifier.pt"


class Net(nn.Module):
    def __init__(self):
        super().__init__()

        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        self.features = nn.Sequential(
            *block(1, 32), *block(32, 32), nn.MaxPool2d(2),
            *block(32, 64), *block(64, 64), nn.MaxPool2d(2))
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(0.3), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
            nn.Dropout(0.3), nn.Linear(128, len(CLASSES)))

    def forward(self, x):
        return self.head(self.features(x))


def to_input(u8):
    """uint8 images (N, 28, 28) -> float tensor (N, 1, 28, 28) in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(u8)).float().div(127.5).sub(1.0).unsqueeze(1)


def load_classifier(path=DEFAULT_OUT):
    net = Net()
    state = torch.load(path, map_location="cpu")
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return net.eval()


@torch.no_grad()
def classify(net, u8, batch=500):
    """Predicted class ids for uint8 images (N, 28, 28)."""
    out = []
    for i in range(0, len(u8), batch):
        out.append(net(to_input(u8[i:i + batch])).argmax(1))
    return torch.cat(out).numpy()


def shift_batch(x, gen, pad=2):
    """Random translation by up to pad pixels (zero = background -1 padding)."""
    n = x.shape[0]
    xp = F.pad(x, (pad, pad, pad, pad), value=-1.0)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    out = torch.empty_like(x)
    for i in range(n):
        out[i] = xp[i, :, dy[i]:dy[i] + 28, dx[i]:dx[i] + 28]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    xtr, ytr = load_split("train")
    xte, yte = load_split("test")
    x_all, y_all = to_input(xtr), torch.from_numpy(ytr.copy())
    net = Net()
    steps = args.epochs * (len(x_all) // args.batch)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
    t0 = time.time()
    step = 0
    for ep in range(args.epochs):
        net.train()
        perm = torch.randperm(len(x_all), generator=gen)
        tot, n = 0.0, 0
        for i in range(0, len(perm) - args.batch + 1, args.batch):
            idx = perm[i:i + args.batch]
            x = shift_batch(x_all[idx], gen)
            loss = F.cross_entropy(net(x), y_all[idx], label_smoothing=0.05)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            tot += loss.item() * len(idx)
            n += len(idx)
        net.eval()
        acc = (classify(net, xte) == yte).mean()
        print(f"epoch {ep + 1}: loss {tot / n:.4f}, test accuracy {acc * 100:.2f}%, "
              f"{(time.time() - t0) / 60:.1f} min", flush=True)

    pred = classify(net, xte)
    print(f"test accuracy {(pred == yte).mean() * 100:.2f}% (10,000 images)")
    for c, name in enumerate(CLASSES):
        m = yte == c
        print(f"  {c} {name:12s} {(pred[m] == c).mean() * 100:6.2f}%")
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in net.state_dict().items()},
               args.out)
    # the saved (fp16) weights are what eval_default.py uses: report them too
    pred16 = classify(load_classifier(args.out), xte)
    print(f"saved {args.out} ({Path(args.out).stat().st_size / 1e6:.2f} MB); "
          f"test accuracy of the saved fp16 weights {(pred16 == yte).mean() * 100:.2f}%")


if __name__ == "__main__":
    main()
