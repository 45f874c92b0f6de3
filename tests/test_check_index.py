"""The semantic index answers what the rule families need: names, bindings, loops, classes, regions."""

from __future__ import annotations

import ast
import gc
import weakref

import pytest

from torchdoctor.rules.static.engine import walk
from torchdoctor.rules.static.index import INDEX_NODES, Index, canonical


def build(source: str) -> Index:
    tree = ast.parse(source)
    buckets, parents = walk(tree, set(INDEX_NODES) | {ast.If, ast.With, ast.Expr})
    return Index(tree, buckets, parents, source)


def call_at(index: Index, text: str) -> ast.Call:
    """The first call whose source starts with `text`."""
    for call in index.nodes(ast.Call):
        if ast.unparse(call).startswith(text):
            return call
    raise AssertionError(f"no call {text!r}")


_EVERY_SHAPE = """
import a.b as c
from .d import (e, f as g)
@dec(1)
async def h(x, /, y=1, *args, z, w=2, **kw) -> int:
    global q
    async with m() as (n, o), p:
        async for i in j:
            await k
    try:
        pass
    except (E, F) as err:
        raise G from err
    else:
        del x[1:2, ::3]
    finally:
        assert not y, f"{y!r:>{w}}"
    match y:
        case {"k": [1, *rest], **more} if rest:
            return {**kw, 1: 2}
        case Point(1, y=2) | None:
            yield from (i async for i in j if i)
    lambda a=1, *b: (yield a)
    return [x for x in {y: z for y, z in w} if -x < y <= z], {1, 2}, x if y else z, x @ y, (w := 3)
class C(B, metaclass=M):
    x: int = 1
    def f(self): nonlocal_name = ...; return self.x[1]
"""


def _reference_walk(tree: ast.AST) -> tuple[list[ast.AST], dict[ast.AST, ast.AST]]:
    """Pre-order nodes and parents by testing every field value: what the engine's walk must equal."""
    leaves = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)
    order: list[ast.AST] = []
    parents: dict[ast.AST, ast.AST] = {}

    def visit(node: ast.AST) -> None:
        order.append(node)
        for value in ast.iter_fields(node):
            items = value[1] if isinstance(value[1], list) else [value[1]]
            for item in items:
                if isinstance(item, ast.AST) and not isinstance(item, leaves):
                    parents[item] = node
                    visit(item)

    visit(tree)
    return order, parents


def test_the_walk_visits_every_child_in_source_order():
    tree = ast.parse(_EVERY_SHAPE)
    order, parents = _reference_walk(tree)
    kinds = {type(n) for n in order}
    buckets, found = walk(tree, kinds)
    assert found == parents
    assert all(buckets[k] == [n for n in order if type(n) is k] for k in kinds)
    assert {ast.MatchMapping, ast.MatchClass, ast.AsyncWith, ast.NamedExpr, ast.FormattedValue} <= kinds


def test_a_kind_no_rule_declared_is_collected_when_asked_in_the_walks_order():
    # A helper shared by several rules may read a kind (ast.Attribute) that the rule calling it did not declare in
    # `reads=`; the answer must be the walk's, not an empty list (TD209's near miss went silent that way).
    tree = ast.parse(_EVERY_SHAPE)
    order, _ = _reference_walk(tree)
    buckets, parents = walk(tree, set(INDEX_NODES))
    assert ast.Attribute not in buckets
    index = Index(tree, buckets, parents, _EVERY_SHAPE)
    wanted = [n for n in order if type(n) is ast.Attribute]
    assert wanted and index.nodes(ast.Attribute) == wanted


def test_import_aliases_resolve_to_qualified_names():
    index = build(
        "import torch\nimport torch.nn.functional as F\nfrom torch import nn, optim as o\n"
        "from torch.cuda.amp import autocast as ac, GradScaler\nfrom torch.nn.modules.linear import Linear\n"
        "F.softmax(x)\nnn.Linear(2, 2)\nac()\no.AdamW([])\nLinear(1, 1)\ntorch.nn.functional.relu(x)\n"
    )
    calls = {ast.unparse(c.func): index.callee(c) for c in index.nodes(ast.Call)}
    assert calls == {
        "F.softmax": "torch.nn.functional.softmax",
        "nn.Linear": "torch.nn.Linear",
        "ac": "torch.cuda.amp.autocast",
        "o.AdamW": "torch.optim.AdamW",
        "Linear": "torch.nn.Linear",
        "torch.nn.functional.relu": "torch.nn.functional.relu",
    }
    assert canonical("torch.nn.parallel.distributed.DistributedDataParallel") == "torch.nn.parallel.DistributedDataParallel"
    assert canonical("torch.optim.adamw.AdamW") == "torch.optim.AdamW"
    assert canonical("torch.optim.lr_scheduler.OneCycleLR") == "torch.optim.lr_scheduler.OneCycleLR"


def test_bindings_know_loaders_samplers_schedulers_optimizers_scalers_models():
    index = build(
        """
import torch
from torch.utils.data import DataLoader, DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import OneCycleLR
from torch import nn

class Net(nn.Module):
    pass

class Bigger(Net):
    pass

sampler = DistributedSampler(train_set, shuffle=True)
train_loader = DataLoader(train_set, batch_size=32, sampler=sampler, num_workers=4, **extra)
model = Bigger().to(device)
model = torch.compile(model)
model = DDP(model, device_ids=[local_rank])
raw = model.module
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
scheduler = OneCycleLR(optimizer, max_lr=1e-3, total_steps=1000)
scaler = torch.amp.GradScaler("cuda")
criterion = nn.CrossEntropyLoss()
ctx = torch.autocast("cuda", dtype=torch.bfloat16)
self_less = nn.Sequential(nn.Linear(2, 2))
"""
    )
    loader = index.binding("train_loader")
    assert loader.kind == "dataloader" and loader.cls == "torch.utils.data.DataLoader"
    assert set(loader.kwargs) == {"batch_size", "sampler", "num_workers"} and loader.star_kwargs
    assert ast.unparse(loader.arg("num_workers")) == "4"
    assert index.binding("sampler").cls == "torch.utils.data.DistributedSampler"  # canonical spelling
    model = index.binding("model")
    assert (model.kind, model.cls, model.wrapper, model.compiled, model.inner) == ("module", "Bigger", "ddp", True, "model")
    assert index.binding("raw").kind == "module" and index.binding("raw").wrapper is None
    assert index.binding("optimizer").cls == "torch.optim.AdamW"
    assert index.binding("scheduler").cls == "torch.optim.lr_scheduler.OneCycleLR"
    assert index.binding("scaler").kind == "scaler"
    assert index.binding("criterion").kind == "loss"
    assert index.binding("ctx").kind == "autocast"
    assert index.binding("self_less").kind == "module"
    assert {c.name for c in index.module_classes} == {"Net", "Bigger"}  # indirect base in the same file
    assert index.kind_of(ast.parse("val_dl", mode="eval").body) == "dataloader"


def test_accelerate_prepare_and_fsdp2_wrap_in_place():
    index = build(
        "from torch import nn\nfrom torch.distributed.fsdp import fully_shard\n"
        "model = nn.Linear(2, 2)\noptimizer = torch.optim.SGD(model.parameters())\n"
        "model, optimizer = accelerator.prepare(model, optimizer)\n"
        "net = nn.Linear(2, 2)\nfully_shard(net)\n"
    )
    assert index.binding("model").wrapper == "accelerate" and index.binding("optimizer").kind == "optimizer"
    assert index.binding("net").wrapper == "fsdp"


LOOPS = """
import torch

def train_one_epoch(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        loss = model(x).sum()
        loss.backward()
        optimizer.step()

def evaluate(model, val_loader):
    model.eval()
    for x, y in val_loader:
        model(x)

def main(model, train_loader, val_loader, optimizer, scheduler):
    for epoch in range(10):
        sampler.set_epoch(epoch)
        train_one_epoch(model, train_loader, optimizer)
        scheduler.step()
        evaluate(model, val_loader)

it = 0
while True:
    for micro in range(4):
        loss = model(get_batch()).mean() / 4
        loss.backward()
    optimizer.step()
    it += 1
"""


def test_loops_batch_vs_epoch_and_training_vs_validation():
    index = build(LOOPS)
    by_line = {loop.line: loop for loop in index.loops.values()}
    batch, val, epoch, outer, micro = by_line[5], by_line[13], by_line[17], by_line[24], by_line[25]
    assert batch.kind == "batch" and batch.trains and batch.has_backward and batch.has_step and batch.iterates_loader
    assert val.kind == "batch" and val.validation and not val.trains
    assert epoch.kind == "epoch" and epoch.trains and epoch.calls_training and not epoch.validation
    assert outer.kind == "batch" and outer.has_step and micro.parent is outer and micro.has_backward
    assert index.step_loop_of(call_at(index, "scheduler.step")) is None
    assert index.loop_of(call_at(index, "scheduler.step")) is epoch
    assert index.training_loop_of(call_at(index, "sampler.set_epoch")) is epoch
    assert index.step_loop_of(call_at(index, "optimizer.step")) is batch
    assert [lp.line for lp in index.loops_around(call_at(index, "loss.backward"))] == [5]
    assert {fn.name for fn in index.training_functions if hasattr(fn, "name")} == {"train_one_epoch", "main"}



def test_the_loops_are_freed_with_the_index_without_the_garbage_collector():
    # a loop and its nested loops must not hold each other both ways: such a cycle kept the loops, and the subtree
    # of every loop they hold, alive until the collector's next pass
    gc.disable()
    try:
        index = build(LOOPS)
        micro = next(lp for lp in index.loops.values() if lp.line == 25)
        assert micro.parent is not None and micro in micro.parent.children
        freed = weakref.ref(micro)
        del index, micro
        assert freed() is None
    finally:
        gc.enable()

def test_env_step_is_not_an_optimizer_step():
    index = build("for t in range(10):\n    obs, r, done, info = env.step(action)\n    scheduler.step()\n")
    assert index.step_calls == [] and not any(lp.trains for lp in index.loops.values())


FROM_USE = """
optimizer, scheduler = model.get_optimizer(total_steps=steps)
warmup = trainer.build_warmup()
for batch in loader:
    env.step()
    loss = model(batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
    self.lr_sched.step()
    helper.step()
print(warmup.get_last_lr())
warmup.step()
helper.zero_grad()
"""


def test_a_scheduler_is_known_by_use_when_no_constructor_shows_it():
    index = build(FROM_USE)
    kinds = {name: index.kind_of(ast.parse(name, mode="eval").body)
             for name in ("scheduler", "self.lr_sched", "warmup", "env", "helper", "optimizer")}
    # stepped after the optimizer in the same block, or asked for its learning rate: a scheduler; `env` steps
    # before any optimizer step, and `helper` also answers zero_grad() (an optimizer-like object, not a schedule)
    assert kinds == {"scheduler": "scheduler", "self.lr_sched": "scheduler", "warmup": "scheduler",
                     "env": None, "helper": None, "optimizer": "optimizer"}
    assert index.binding("scheduler").guessed


GUARDS = """
import torch.distributed as dist

if rank == 0:
    torch.save(a, "a")
if dist.get_rank() == 0:
    torch.save(b, "b")
if is_main_process():
    torch.save(c, "c")
if accelerator.is_main_process:
    torch.save(d, "d")
if self.global_rank == 0 and epoch % 5 == 0:
    torch.save(e, "e")
if master_process:
    torch.save(f, "f")
if int(os.environ.get("LOCAL_RANK", 0)) == 0:
    torch.save(g, "g")
if args.local_rank in [-1, 0]:
    torch.save(h, "h")
if not dist.is_initialized() or dist.get_rank() == 0:
    torch.save(i, "i")
if rank != 0:
    pass
else:
    torch.save(j, "j")
torch.save(everyone, "x")
if epoch % 5 == 0:
    torch.save(periodic, "y")

def save(state):
    if dist.get_rank() != 0:
        return
    torch.save(state, "z")

@rank_zero_only
def log(state):
    torch.save(state, "w")
"""


def test_rank_guards():
    index = build(GUARDS)
    saves = {ast.unparse(c.args[0]): index.rank_guarded(c) for c in index.calls_to("torch.save")}
    assert saves == {**{k: True for k in "abcdefghij"}, "everyone": False, "periodic": False, "state": True}


def test_grad_disabled_regions():
    index = build(
        """
import torch

@torch.no_grad()
def a(m, x):
    return m(x)

@torch.inference_mode
def b(m, x):
    return m(x)

def c(m, x):
    with torch.inference_mode(mode=False):
        return m(x)

def d(m, x):
    torch.set_grad_enabled(False)
    return m(x)

def helper(m, x):
    return m(x)

def e(m, x):
    with torch.no_grad():
        helper(m, x)

def f(m, x):
    return m(x)
"""
    )
    results = {
        index.function_of(c).name: index.grad_disabled(c)
        for c in index.nodes(ast.Call)
        if ast.unparse(c) == "m(x)"
    }
    assert results == {"a": True, "b": True, "c": False, "d": True, "helper": True, "f": False}


def test_autocast_regions_and_dtypes():
    index = build(
        """
import torch
from torch.cuda.amp import autocast as ac

ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16)
with torch.autocast("cuda"):
    a = model(x)
with torch.amp.autocast("cuda", torch.bfloat16):
    b = model(x)
with ac():
    c = model(x)
with ctx:
    d = model(x)
with torch.autocast("cpu"):
    e = model(x)
f = model(x)
"""
    )
    found = {}
    for call in index.nodes(ast.Call):
        if ast.unparse(call) == "model(x)":
            region = index.autocast_at(call)
            name = ast.unparse(index.parent(call).targets[0])
            found[name] = (region.device, region.dtype) if region else None
    assert found == {
        "a": ("cuda", "float16"),
        "b": ("cuda", "bfloat16"),
        "c": ("cuda", "float16"),
        "d": ("cuda", "bfloat16"),
        "e": ("cpu", "bfloat16"),
        "f": None,
    }
    assert "amp" in index.contexts()


def test_classes_forward_and_autograd_functions():
    index = build(
        """
import torch
from torch import nn
from torch.autograd import Function
import lightning as L

class Square(Function):
    @staticmethod
    def forward(ctx, x):
        return x * x

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.mask = torch.ones(2)

    def forward(self, x):
        return self.fc(x) * self.mask

class Lit(L.LightningModule):
    def training_step(self, batch, i):
        return self(batch)
"""
    )
    assert {c.name for c in index.function_classes} == {"Square"}
    assert {c.name for c in index.module_classes} == {"Net", "Lit"}
    net = index.classes["Net"]
    assert [a.attr for a in index.self_assignments(net)] == ["fc", "mask"]
    assert set(index.self_reads(net)) == {"fc", "mask"}
    fc_call = call_at(index, "self.fc(x)")
    assert index.forward_of(fc_call) is net
    assert index.is_model(call_at(index, "self(batch)").func)
    assert "custom-autograd" in index.contexts()


@pytest.mark.parametrize(
    "source, contexts",
    [
        ("import torch.distributed as dist\ndist.init_process_group('nccl')\n", {"distributed"}),
        ("scaler = torch.amp.GradScaler()\n", {"amp"}),
        ("model = torch.compile(model)\n", {"compile"}),
        ("x = x.cuda()\n", {"gpu"}),
        ("device = 'cuda:1'\n", {"gpu"}),
        ("import torch\nx = torch.ones(2)\n", set()),
    ],
)
def test_contexts(source, contexts):
    assert build(source).contexts() == contexts


def test_a_call_in_an_asserts_message_is_not_guarded_and_does_not_crash():
    """peft's accelerate examples: `assert len(preds) == n, f"{len(preds)} != {n}"` in the loop. The walk up from
    the message reached the `assert`, which has no else branch (AttributeError, a TD000 on a valid file)."""
    index = build(
        "import torch\nfor x, y in loader:\n    loss = model(x)\n"
        "    assert x.shape[0] == y.shape[0], f'{len(x)} for {len(y)}'\n"
        "    loss.backward()\n    optimizer.step()\n"
    )
    (loop,) = index.training_loops()
    message = call_at(index, "len(x)")
    test = next(n for n in ast.walk(index.tree) if isinstance(n, ast.Compare))
    # the message runs only when the assertion fails: as conditional as the body of an `if` on the same test
    assert index.guarded_in_loop(message, loop) is True
    assert index.guarded_in_loop(message, loop, rare=True) in (True, False)  # answered, not raised
    assert index.guarded_in_loop(test.left, loop)  # the test itself: the iteration decides


def test_a_name_that_hands_its_parameters_to_an_optimizer_is_a_model():
    # pointnet.pytorch: the class comes from another file; the optimizer takes its parameters
    index = build(
        "import torch.optim as optim\nfrom pointnet import PointNetCls\n"
        "classifier = PointNetCls(k=16)\noptimizer = optim.SGD(classifier.parameters(), lr=0.01)\n"
        "pred = classifier(points)\nrunner = Runner(cfg)\nrunner.train()\nout = runner(batch)\n"
    )
    assert index.is_model(call_at(index, "classifier(points)").func)
    # a trainer-like object that only has .train() is not taken for a model
    assert not index.is_model(call_at(index, "runner(batch)").func)


def test_an_instance_of_a_plain_class_of_the_file_is_not_a_duck_typed_model():
    # rtdl's grownet: DynamicNet is a plain class that gathers its members' parameters
    index = build(
        "import torch\nclass DynamicNet:\n    def parameters(self):\n        return []\n"
        "net_ensemble = DynamicNet()\nopt = torch.optim.Adam(net_ensemble.parameters())\n"
        "def predict(x):\n    return net_ensemble.forward(x)\n"
    )
    assert not index.is_model(call_at(index, "net_ensemble.forward(x)").func.value)



# -- classes of other files of the project (semantic/projectclasses.py) ------------------------------------------

_NETWORK = """
import torch.nn as nn
from torch import nn as tnn

class coRNN(nn.Module):
    pass

class Base(
        tnn.Module):
    pass

class Wide(Base):
    pass

class Config(object):
    pass
"""


def _project(files: dict[str, str]):
    from torchdoctor.rules.static.semantic.projectclasses import build

    return build(files.items())


def _with_project(source: str, files: dict[str, str]) -> Index:
    tree = ast.parse(source)
    buckets, parents = walk(tree, set(INDEX_NODES) | {ast.If, ast.With, ast.Expr})
    return Index(tree, buckets, parents, source, _project(files))


def test_a_module_class_of_another_file_makes_a_model_binding():
    train = "import network\nrnn = network.coRNN(1, 2)\ncfg = network.Config()\n"
    index = _with_project(train, {"network": _NETWORK})
    b = index.binding("rnn")
    assert b is not None and b.kind == "module" and b.cls == "network.coRNN"
    assert index.binding("cfg") is None  # a plain class of that file is no model
    losses = _with_project("from layers import MultiBoxLoss\ncriterion = MultiBoxLoss(3)\n",
                           {"layers": "import torch.nn as nn\nclass MultiBoxLoss(nn.Module):\n    pass\n"})
    assert losses.binding("criterion").kind == "loss"  # a module class named as a loss is one, as in torch.nn
    kd = _with_project("from distill import DML\ncriterionKD = DML(3)\nstudent = DML(3)\n",
                       {"distill": "import torch.nn as nn\nclass DML(nn.Module):\n    pass\n"})
    assert kd.binding("criterionKD").kind == "loss" and kd.binding("student").kind == "module"
    assert build(train).binding("rnn") is None  # without the pre-pass the file cannot know


def test_project_bases_are_followed_across_files_and_packages():
    project = _project({"pkg.network": _NETWORK, "pkg.models.unet": "class UNet(Wide):\n    pass\n"})
    assert project.is_module_class("pkg.network.Wide")  # through Base, two lines of header
    assert project.is_module_class(".network.Base")  # a relative import
    assert project.is_module_class("models.UNet")  # re-exported by the package, defined in one of its modules
    assert not project.is_module_class("network.Config")
    assert not project.is_module_class("other.coRNN")  # no module of the project by that name
    source = "from models.unet import UNet\nclass Big(UNet):\n    def forward(self, x):\n        return x\n"
    index = _with_project(source, {"models.unet": "import torch\nclass UNet(torch.nn.Module):\n    pass\n"})
    assert index.classes["Big"].is_module
    assert not _with_project(source, {"models.unet": "class UNet:\n    pass\n"}).classes["Big"].is_module


def test_a_star_import_of_a_project_module_names_its_module_classes():
    source = "from models import *\ngenerator = Generator()\nmeter = Meter()\n"
    files = {"models": "import torch.nn as nn\nclass Generator(nn.Module):\n    pass\nclass Meter:\n    pass\n"}
    index = _with_project(source, files)
    assert index.binding("generator").kind == "module"
    assert index.binding("meter") is None


def test_a_parameter_name_two_functions_share_keeps_no_kind_when_callers_disagree_by_name():
    source = """
import torch
def inner(net, loader):
    for x in loader:
        net(x)
def outer(net, loader):
    inner(loader, net)
model = torch.nn.Linear(2, 2)
outer(model, [])
"""
    assert build(source).binding("net") is None  # inner's `net` is handed `loader`: no kind file-wide
    agreeing = source.replace("inner(loader, net)", "inner(net, loader)")
    assert build(agreeing).binding("net").kind == "module"


def _handed_index(source: str, module: str, files: dict[str, str], told: bool = True) -> Index:
    tree = ast.parse(source)
    buckets, parents = walk(tree, set(INDEX_NODES) | {ast.If, ast.With, ast.Expr})
    return Index(tree, buckets, parents, source, _project({module: source, **files}), module if told else None)


_FUNCTION = """
def train(config, data, net, crit, opt, sched):
    pass
class Runner:
    def __init__(self, net, data):
        self.net = net
"""
_CALLER = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from torch.optim.lr_scheduler import StepLR
from core.function import train, Runner
from models import Net
model = Net()
model = nn.parallel.DistributedDataParallel(model)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = StepLR(optimizer, 1)
train_loader = DataLoader(range(4))
train(cfg, train_loader, model, criterion, optimizer, sched=scheduler)
runner = Runner(model, data=train_loader)
"""
_NET = "import torch.nn as nn\nclass Net(nn.Module):\n    pass\n"


def test_parameters_take_the_kinds_callers_in_other_files_hand_in():
    index = _handed_index(_FUNCTION, "core.function", {"train": _CALLER, "models": _NET})
    got = {n: (index.binding(n).kind, index.binding(n).cls, index.binding(n).wrapper)
           for n in ("data", "net", "crit", "opt", "sched")}
    assert got == {"data": ("dataloader", "torch.utils.data.DataLoader", None),
                   "net": ("module", "models.Net", "ddp"),  # the class under the wrapper, and the wrapper
                   "crit": ("loss", "torch.nn.CrossEntropyLoss", None),
                   "opt": ("optimizer", "torch.optim.SGD", None),
                   "sched": ("scheduler", "torch.optim.lr_scheduler.StepLR", None)}
    assert index.binding("self.net").kind == "module"  # the constructor's parameter, copied onto self
    assert index.binding("config") is None and index.binding("data").call is None  # no constructor to read
    unknown = _handed_index(_FUNCTION, "core.function", {"train": _CALLER, "models": _NET}, told=False)
    assert unknown.binding("data") is None  # a file that does not know its module asks nothing


def test_handed_kinds_yield_to_disagreement_and_to_the_files_own_bindings():
    other = _CALLER.replace("from models import Net", "from models import Net\nimport torch.optim as optim")
    other = other.replace("train(cfg, train_loader,", "train(cfg, optimizer,")  # `data` handed an optimizer
    index = _handed_index(_FUNCTION, "core.function", {"train": _CALLER, "probe": other, "models": _NET})
    assert index.binding("data") is None  # callers disagree: unknown, also in Runner (the name is file-wide)
    assert index.binding("net").kind == "module"
    named = _CALLER.replace("train(cfg, train_loader,", "train(cfg, val_loader,")  # a name that says a loader
    assert _handed_index(_FUNCTION, "core.function", {"train": named, "models": _NET}).binding("data") is not None
    said = _CALLER + "train(cfg, train_loader, my_optimizer, criterion, optimizer)\n"  # `net` handed an optimizer's name
    assert _handed_index(_FUNCTION, "core.function", {"train": said, "models": _NET}).binding("net") is None
    own = _FUNCTION.replace("    pass", "    data = [1, 2]\n    net = torch.nn.Linear(2, 2)")
    index = _handed_index("import torch\n" + own, "core.function", {"train": _CALLER, "models": _NET})
    assert index.binding("net").cls == "torch.nn.Linear"  # the file's own binding wins


_FACTORIES = """
import torch.nn as nn
from torch.utils.data import DataLoader
class Net(nn.Module):
    pass
def build_model(cfg):
    model = Net()
    if cfg.parallel:
        model = nn.DataParallel(model)
    criterion = nn.CrossEntropyLoss()
    return model, criterion
def get_loader(cfg):
    return DataLoader(range(4), batch_size=cfg.bs)
def pick(cfg):
    if cfg.a:
        return Net()
    return DataLoader(range(4))
def config():
    return {"lr": 0.1}
"""


def test_a_factory_of_another_file_gives_what_it_returns():
    source = ("from models import build_model, get_loader, pick, config\nmodel, criterion = build_model(cfg)\n"
              "loader = get_loader(cfg)\nthing = pick(cfg)\nsettings = config()\n")
    index = _handed_index(source, "train", {"models": _FACTORIES})
    model, criterion, loader = (index.binding(n) for n in ("model", "criterion", "loader"))
    assert (model.kind, model.cls, model.wrapper) == ("module", "models.Net", "dp")  # the class under the wrapper
    assert (criterion.kind, criterion.cls) == ("loss", "torch.nn.CrossEntropyLoss")
    assert (loader.kind, loader.call) == ("dataloader", None)  # its arguments are the other file's
    assert index.binding("thing") is None  # returns that disagree say nothing
    assert index.binding("settings") is None
    assert _handed_index(source, "train", {"other": _FACTORIES}).binding("loader") is None  # not that module


def test_kinds_a_factory_returns_are_handed_on_to_another_files_function():
    caller = "from models import build_model\nfrom engine import evaluate\nnet, crit = build_model(cfg)\nevaluate(net, crit)\n"
    engine = "def evaluate(model, loss_fn):\n    pass\n"
    index = _handed_index(engine, "engine", {"train": caller, "models": _FACTORIES})
    assert index.binding("model").kind == "module" and index.binding("loss_fn").kind == "loss"


def test_parameter_annotations_give_kinds_without_arguments():
    source = """
from typing import Optional
import torch
from torch.utils.data import DataLoader
def train_one_epoch(model: torch.nn.Module, criterion: torch.nn.CrossEntropyLoss, data_loader: DataLoader,
                    optimizer: torch.optim.Optimizer, scheduler: Optional[torch.optim.lr_scheduler.LRScheduler],
                    steps: int, weights: torch.nn.Parameter, config: "Config"):
    pass
"""
    index = build(source)
    kinds = {n: index.binding(n).kind for n in ("model", "criterion", "data_loader", "optimizer", "scheduler")}
    assert kinds == {"model": "module", "criterion": "loss", "data_loader": "dataloader", "optimizer": "optimizer",
                     "scheduler": "scheduler"}
    assert build(source.replace("criterion: torch.nn.CrossEntropyLoss", "criterion: torch.nn.Module")).binding(
        "criterion").kind == "loss"  # DETR's `criterion: torch.nn.Module`: the name says which module it is
    assert index.binding("data_loader").call is None  # no constructor: its defaults are not the caller's
    assert all(index.binding(n) is None for n in ("steps", "weights", "config"))


def test_a_copy_beside_an_unwrapping_branch_holds_the_plain_model():
    source = """
import torch
def train(generator):
    if distributed:
        g_module = generator.module
    else:
        g_module = generator
    torch.save(g_module.state_dict(), "g.pt")
generator = torch.nn.Linear(2, 2)
generator = torch.nn.parallel.DistributedDataParallel(generator)
train(generator)
"""
    assert build(source).binding("g_module").wrapper is None
    alone = source.replace("        g_module = generator.module", "        g_module = generator")
    assert build(alone).binding("g_module").wrapper == "ddp"


_REBOUND = """
import torch
from torch.optim import lr_scheduler

opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
sched = lr_scheduler.StepLR(opt, 10)
sched.step()
if flag:
    sched = lr_scheduler.ExponentialLR(opt, 0.9)
sched.step()
sched = lr_scheduler.ReduceLROnPlateau(opt)
sched.step(1.0)


def train():
    sched.step()
"""


def test_reaching_bindings_follow_order_branches_and_scopes():
    index = build(_REBOUND)
    steps = sorted(index.method_calls("step"), key=lambda c: c.lineno)
    classes = [[b.short_cls for b in index.reaching("sched", s)] for s in steps]
    assert classes[0] == ["StepLR"]  # a later rebinding (a later notebook cell) is not this use's
    assert classes[1] == ["ExponentialLR", "StepLR"]  # a binding under `if` lets the earlier one through
    assert classes[2] == ["ReduceLROnPlateau"]
    assert set(classes[3]) == {"StepLR", "ExponentialLR", "ReduceLROnPlateau"}  # a function reads the global
    assert index.binding("sched").short_cls == "ReduceLROnPlateau"  # binding() stays the file's latest


PHASES = """
import contextlib
import torch


def fit(model, loaders, optimizer, criterion):
    for phase in ["train", "val"]:
        model.train(phase == "train")
        context = torch.no_grad() if phase != "train" else contextlib.nullcontext()
        with context:
            for x, y in loaders[phase]:
                loss = criterion(model(x), y)
                if phase == "train" and optimizer is not None:
                    loss.backward()
                    optimizer.step()


def step(split, loader, model, optimizer=None):
    for x in loader:
        loss = model(x).mean()
        if split not in ("val", "test"):
            loss.backward()


def main(model, tl, vl, optimizer, criterion):
    step("train", tl, model, optimizer)
    step("test", vl, model)
    fit(model, {"train": tl, "val": vl}, optimizer, criterion)
"""


def test_phases_take_both_sides_of_a_value_decided_at_run_time():
    index = build(PHASES)
    batch = next(lp for lp in index.loops.values() if lp.line == 11)  # `for x, y in loaders[phase]:`
    phase = index.loop_phase(batch)
    assert phase is not None and (phase.name, phase.values, phase.evaluation) == ("phase", ("train", "val"), ("val",))
    backward = next(c for c in index.backward_calls if index.function_of(c).name == "fit")
    forward = next(c for c in batch.calls if index.call_runs_model(c))
    # the backward runs for 'train' (its test also reads `optimizer`: undecided, so possible) and never for 'val'
    assert index.runs_in_phase(backward, phase, "train") and not index.runs_in_phase(backward, phase, "val")
    assert index.runs_in_phase(forward, phase, "val")
    assert index.grad_off_in_phase(forward, phase, "val") and not index.grad_off_in_phase(forward, phase, "train")
    switch = next(c for c in index.method_calls("train") if index.function_of(c).name == "fit")
    assert index.mode_in_phase(switch, phase, "val") == "eval" and index.mode_in_phase(switch, phase, "train") == "train"
    step = index.functions["step"]
    by_call = index.parameter_phase(step)
    assert by_call is not None and by_call.name == "split" and by_call.evaluation == ("test",)
    assert [c.args[0].value for c in by_call.origins] == ["test"]
    inner = next(c for c in index.backward_calls if index.function_of(c) is step)
    assert not index.runs_in_phase(inner, by_call, "test") and index.runs_in_phase(inner, by_call, "train")
    assert index.parameter_phase(index.functions["main"]) is None


ASSIGNED = """
a, (b, c) = Net(), (1, [2, 3])
self.head: Head = make()
def fit(model, loader, modes=('train', 'test')):
    phases = ['train', 'val']
    for phase in phases:
        for x in loader:
            model(x)
    for mode in modes:
        for x in loader:
            model(x)
    for other in loader:
        for x in other:
            model(x)
"""


def test_assigned_values_unpack_targets_and_rule_names_out_before_the_scoped_table():
    index = build(ASSIGNED)
    values = index.assigned_values()
    assert {k: [type(v).__name__ for v in vs] for k, vs in values.items()} == {
        "phases": ["List"], "a": ["Call"], "b": ["Constant"], "c": ["List"], "self.head": ["Call"]}
    assert index.assigned_a("phases", (ast.Tuple, ast.List)) and index.assigned_a("a", ast.Call)
    assert not index.assigned_a("loader", ast.Call) and not index.assigned_a("b", ast.Call)
    # a list bound by an assignment and a parameter's default both give a phase; a plain loader gives none, and
    # asking about it never builds the table of assignments by scope
    index = build(ASSIGNED)
    inner = sorted((lp for lp in index.loops.values() if lp.parent is not None), key=lambda lp: lp.line)
    assert index.loop_phase(inner[2]) is None and index._defs is None
    assert [index.loop_phase(lp).values for lp in inner[:2]] == [("train", "val"), ("train", "test")]
