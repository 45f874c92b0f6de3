"""Source: https://github.com/meituan/YOLOv6/commit/9dee24b84d9c46a9ae3dd4666ec835723df7f5d8
("fix resume optimizer bug"). Read: yolov6/core/engine.py (Trainer: __init__'s resume branch, train,
train_in_loop, train_in_steps, eval_and_save, train_after_loop, update_optimizer) and yolov6/utils/checkpoint.py
(save_checkpoint, strip_optimizer) at the fix's parent (9dee24b^).

Bug: when training ends, train_after_loop calls strip_optimizer on the weights folder, which rewrites
last_ckpt.pt (and best_ckpt.pt) with `optimizer`, `ema` and `updates` set to None. The run's only resumable
checkpoint therefore holds no optimizer state: `--resume weights/last_ckpt.pt` to continue for more epochs fails at
`self.optimizer.load_state_dict(self.ckpt['optimizer'])`. The fix removed the strip_optimizer call.

Theirs: the Trainer's method structure and bodies as listed above (checkpoint dict keys, save_checkpoint and
strip_optimizer verbatim, the per-epoch scheduler.step() in prepare_for_steps, the GradScaler disabled on CPU, the
64-image accumulation in update_optimizer, EMA updated after each step). Ours: a tiny conv classifier and
cross-entropy instead of the YOLO model and its loss, random images, SGD and LambdaLR standing in for
build_optimizer/build_lr_scheduler, a minimal ModelEMA, no evaluation/tensorboard/warmup, args as a namespace,
the weights written under a temporary folder.
"""
import math
import os
import os.path as osp
import shutil
import tempfile
import time
from copy import deepcopy
from types import SimpleNamespace

import torch
from torch import nn
from torch.cuda import amp

torch.manual_seed(0)


def save_checkpoint(ckpt, is_best, save_dir, model_name=""):
    """ Save checkpoint to the disk."""
    if not osp.exists(save_dir):
        os.makedirs(save_dir)
    filename = osp.join(save_dir, model_name + '.pt')
    torch.save(ckpt, filename)
    if is_best:
        best_filename = osp.join(save_dir, 'best_ckpt.pt')
        shutil.copyfile(filename, best_filename)


def strip_optimizer(ckpt_dir, epoch):
    """Delete optimizer from saved checkpoint file"""
    for s in ['best', 'last']:
        ckpt_path = osp.join(ckpt_dir, f'{s}_ckpt.pt')
        if not osp.exists(ckpt_path):
            continue
        ckpt = torch.load(ckpt_path, map_location=torch.device('cpu'), weights_only=False)
        if ckpt.get('ema'):
            ckpt['model'] = ckpt['ema']  # replace model with ema
        for k in ['optimizer', 'ema', 'updates']:  # keys
            ckpt[k] = None
        ckpt['epoch'] = epoch
        ckpt['model'].half()  # to FP16
        for p in ckpt['model'].parameters():
            p.requires_grad = False
        torch.save(ckpt, ckpt_path)


class ModelEMA:
    def __init__(self, model, decay=0.9999):
        self.ema = deepcopy(model).eval()
        self.updates = 0
        self.decay = lambda x: decay * (1 - math.exp(-x / 2000))
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model):
        with torch.no_grad():
            self.updates += 1
            d = self.decay(self.updates)
            for k, v in self.ema.state_dict().items():
                if v.dtype.is_floating_point:
                    v *= d
                    v += (1 - d) * model.state_dict()[k].detach()


class TinyDetector(nn.Module):
    def __init__(self, nc):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.SiLU(),
                                      nn.Conv2d(16, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.SiLU())
        self.head = nn.Linear(32, nc)

    def forward(self, x):
        feat = self.backbone(x)
        return self.head(feat.mean((2, 3))), [feat]


class Trainer:
    def __init__(self, args, device):
        self.args = args
        self.device = device
        if args.resume:
            self.ckpt = torch.load(args.resume, map_location='cpu', weights_only=False)
        self.rank = args.rank
        self.main_process = self.rank in [-1, 0]
        self.save_dir = args.save_dir
        self.num_classes = 5
        images = torch.randn(160, 3, 32, 32)
        labels = torch.randint(0, self.num_classes, (160,))
        self.train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels),
                                                        batch_size=args.batch_size, shuffle=True)
        model = TinyDetector(self.num_classes).to(device)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
        self.lf = lambda x: (1 - x / args.epochs) * 0.99 + 0.01
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda=self.lf)
        self.ema = ModelEMA(model) if self.main_process else None
        self.start_epoch = 0
        # resume
        if hasattr(self, "ckpt"):
            resume_state_dict = self.ckpt['model'].float().state_dict()  # checkpoint state_dict as FP32
            model.load_state_dict(resume_state_dict, strict=True)  # load
            self.start_epoch = self.ckpt['epoch'] + 1
            self.optimizer.load_state_dict(self.ckpt['optimizer'])
            if self.main_process:
                self.ema.ema.load_state_dict(self.ckpt['ema'].float().state_dict())
                self.ema.updates = self.ckpt['updates']
        self.model = model
        self.max_epoch = args.epochs
        self.max_stepnum = len(self.train_loader)
        self.batch_size = args.batch_size
        self.loss_num = 1

    def train(self):
        try:
            self.train_before_loop()
            for self.epoch in range(self.start_epoch, self.max_epoch):  # noqa: B020 (theirs)
                self.train_in_loop(self.epoch)
        except Exception as _:
            print('ERROR in training loop or eval/save model.')
            raise
        finally:
            self.train_after_loop()

    def train_before_loop(self):
        self.start_time = time.time()
        self.scaler = amp.GradScaler(enabled=self.device != 'cpu')
        self.last_opt_step = -1

    def train_in_loop(self, epoch_num):
        self.prepare_for_steps()
        for self.step, self.batch_data in self.pbar:  # noqa: B020 (theirs)
            self.train_in_steps(epoch_num)
            self.print_details()
        self.eval_and_save()

    def prepare_for_steps(self):
        if self.epoch > self.start_epoch:
            self.scheduler.step()
        self.model.train()
        self.mean_loss = torch.zeros(self.loss_num, device=self.device)
        self.optimizer.zero_grad()
        self.pbar = enumerate(self.train_loader)

    def train_in_steps(self, epoch_num):
        images, targets = self.batch_data
        preds, s_featmaps = self.model(images)
        total_loss = nn.functional.cross_entropy(preds, targets)
        loss_items = total_loss.detach().unsqueeze(0)
        self.scaler.scale(total_loss).backward()
        self.loss_items = loss_items
        self.update_optimizer()

    def print_details(self):
        if self.main_process:
            self.mean_loss = (self.mean_loss * self.step + self.loss_items) / (self.step + 1)

    def update_optimizer(self):
        curr_step = self.step + self.max_stepnum * self.epoch
        self.accumulate = max(1, round(64 / self.batch_size))
        if curr_step - self.last_opt_step >= self.accumulate:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()
            if self.ema:
                self.ema.update(self.model)
            self.last_opt_step = curr_step

    def eval_and_save(self):
        if self.main_process:
            ckpt = {
                    'model': deepcopy(self.model).half(),
                    'ema': deepcopy(self.ema.ema).half(),
                    'updates': self.ema.updates,
                    'optimizer': self.optimizer.state_dict(),
                    'epoch': self.epoch,
                    }
            save_ckpt_dir = osp.join(self.save_dir, 'weights')
            save_checkpoint(ckpt, False, save_ckpt_dir, model_name='last_ckpt')
            del ckpt
            print(f'epoch {self.epoch}/{self.max_epoch - 1} loss {self.mean_loss.item():.4f}')

    def train_after_loop(self):
        if self.main_process:
            print(f'\nTraining completed in {(time.time() - self.start_time) / 3600:.3f} hours.')
            save_ckpt_dir = osp.join(self.save_dir, 'weights')
            strip_optimizer(save_ckpt_dir, self.epoch)  # BUG
        if self.device != 'cpu':
            torch.cuda.empty_cache()


args = SimpleNamespace(resume=None, rank=-1, save_dir=tempfile.mkdtemp(), batch_size=16, epochs=4)
trainer = Trainer(args, 'cpu')
trainer.train()
