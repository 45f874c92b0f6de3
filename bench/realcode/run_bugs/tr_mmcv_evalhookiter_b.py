"""mmcv-style epoch runner whose iteration-interval EvalHook leaves the model in eval mode until the epoch ends.

Source: https://github.com/open-mmlab/mmcv/issues/2199 ("Validation by iteration causes
model.training=False to continue until the end of an epoch", moved from open-mmlab/mmaction2#1781)
Original: open-mmlab/mmcv mmcv/runner/epoch_based_runner.py (EpochBasedRunner.train, read at 00f732b:
model.train() once per epoch, hooks around each train_step), mmcv/runner/hooks/evaluation.py
(EvalHook.after_train_iter -> _do_evaluate -> test_fn) and mmcv/engine/test.py (single_gpu_test, which
calls model.eval()); the hook and test function are written from the issue and mmcv's layout.
Bug: with EvalHook(by_epoch=False), _do_evaluate runs single_gpu_test in the middle of an epoch; it sets
model.eval() and nothing sets model.train() again until the next epoch's EpochBasedRunner.train(), so the
rest of the epoch trains with dropout off and batch-norm statistics frozen. The issue is open; the
maintainers suggested calling model.train() after evaluating.
Ours: a small BN + dropout classifier with mmcv's train_step/val contract, random data, the runner and
hooks trimmed to what this path uses (no logger, checkpoint, LR or timer hooks), 2 epochs of 12 iters
with an evaluation every 4 iters.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Hook:
    def before_train_epoch(self, runner):
        pass

    def after_train_iter(self, runner):
        pass

    def after_train_epoch(self, runner):
        pass


class OptimizerHook(Hook):
    def after_train_iter(self, runner):
        runner.optimizer.zero_grad()
        runner.outputs["loss"].backward()
        runner.optimizer.step()


def single_gpu_test(model, data_loader):
    model.eval()
    results = []
    for data in data_loader:
        with torch.no_grad():
            result = model(return_loss=False, **data)
        results.extend(result)
    return results


class EvalHook(Hook):
    def __init__(self, dataloader, interval=1, by_epoch=True, test_fn=None):
        self.dataloader = dataloader
        self.interval = interval
        self.by_epoch = by_epoch
        self.test_fn = test_fn if test_fn is not None else single_gpu_test

    def _should_evaluate(self, runner):
        if self.by_epoch:
            return (runner.epoch + 1) % self.interval == 0
        return (runner.iter + 1) % self.interval == 0

    def after_train_iter(self, runner):
        if not self.by_epoch and self._should_evaluate(runner):
            self._do_evaluate(runner)

    def after_train_epoch(self, runner):
        if self.by_epoch and self._should_evaluate(runner):
            self._do_evaluate(runner)

    def _do_evaluate(self, runner):
        results = self.test_fn(runner.model, self.dataloader)  # BUG
        accuracy = sum(int(r) for r in results) / len(results)
        runner.log_buffer[f"eval_iter_{runner.iter + 1}"] = accuracy


class EpochBasedRunner:
    def __init__(self, model, optimizer, max_epochs):
        self.model = model
        self.optimizer = optimizer
        self._max_epochs = max_epochs
        self._epoch = 0
        self._iter = 0
        self._hooks = []
        self.log_buffer = {}
        self.train_mode_iters = 0
        self.eval_mode_iters = 0

    @property
    def epoch(self):
        return self._epoch

    @property
    def iter(self):
        return self._iter

    def register_hook(self, hook):
        self._hooks.append(hook)

    def call_hook(self, fn_name):
        for hook in self._hooks:
            getattr(hook, fn_name)(self)

    def train(self, data_loader, **kwargs):
        self.model.train()
        self.mode = "train"
        self.data_loader = data_loader
        self.call_hook("before_train_epoch")
        for i, data_batch in enumerate(self.data_loader):
            self._inner_iter = i
            outputs = self.model.train_step(data_batch, self.optimizer, **kwargs)
            self.outputs = outputs
            self.call_hook("after_train_iter")
            self._iter += 1
        self.call_hook("after_train_epoch")
        self._epoch += 1

    def run(self, data_loaders, workflow, max_epochs, **kwargs):
        self._max_epochs = max_epochs
        while self.epoch < self._max_epochs:
            for i, (mode, epochs) in enumerate(workflow):
                epoch_runner = getattr(self, mode)
                for _ in range(epochs):
                    if mode == "train" and self.epoch >= self._max_epochs:
                        break
                    epoch_runner(data_loaders[i], **kwargs)


class Recognizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.5))
        self.cls_head = nn.Linear(64, 5)

    def forward(self, imgs, label=None, return_loss=True):
        cls_score = self.cls_head(self.backbone(imgs))
        if return_loss:
            return {"loss_cls": F.cross_entropy(cls_score, label)}
        return list(cls_score.argmax(1) == label)

    def train_step(self, data_batch, optimizer, **kwargs):
        losses = self(**data_batch)
        loss = losses["loss_cls"]
        return dict(loss=loss, log_vars={"loss_cls": loss.item()}, num_samples=len(data_batch["imgs"]))


def make_loader(n, batch_size):
    imgs = torch.randn(n, 32)
    label = (imgs[:, :5].argmax(1))
    return [{"imgs": imgs[i:i + batch_size], "label": label[i:i + batch_size]} for i in range(0, n, batch_size)]


model = Recognizer()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
runner = EpochBasedRunner(model, optimizer, max_epochs=2)
runner.register_hook(OptimizerHook())
runner.register_hook(EvalHook(make_loader(64, 16), interval=4, by_epoch=False))
runner.run([make_loader(192, 16)], [("train", 1)], max_epochs=2)
print(runner.log_buffer)
