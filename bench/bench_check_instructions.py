"""bench_check_cpu's ratio in instructions executed (valgrind), a figure the machine's load cannot move.

    python bench/bench_check_instructions.py                      # this checkout's venv
    python bench/bench_check_instructions.py --python OTHER/.venv/bin/python   # another checkout, same corpus

On a shared 2-core machine at load 5-9 the CPU-second ratio of bench_check_cpu.py swings by +-0.05 between runs of
the same code, more than most single changes move it. Here three processes run under `valgrind --tool=cachegrind
--cache-sim=no`: one that only starts up (imports, the rule registry, 20 files through each side), one that then
runs bare parse+walk over the corpus, one that then runs the engine (all rules and the project pass, --no-torch).
Each side's count is its process's count less the start-up one. Instructions are not seconds: the engine's Python
runs at fewer instructions per cycle than the parser's C, so its CPU-second ratio is lower than this one; use this to
compare two checkouts, and bench_check_cpu.py for the figure itself. About 5 minutes.

Figures (issue 12, point 4: the engine at >= 0.6x bare parse+walk), each checkout run with its own venv:
main a0f04a2 11.16 G bare, 17.75 G engine, 0.629; h-checkp10 5d736bc 11.20 G, 15.76 G, 0.710 (the engine 11 %
fewer instructions). bench_check_cpu.py --rounds 3 --no-torch, alternated: at load 2, main 0.55x and the branch
0.62x; at load 5-9, main 0.55x, 0.49x, 0.47x, 0.54x, 0.55x, 0.51x and the branch 0.57x, 0.58x, 0.57x, 0.60x,
0.51x, 0.58x. What moved it, findings unchanged (sorted JSON of torch's three trees as one project and file by
file, every fixture folder and file, 33 repositories; every file's project facts, bindings, loops and call sites):
rules that read one shape of a node every file has thousands of (calls bound by an assignment, `x.data[0]`,
`acc = acc + v`, `a / b`, `forward`) find it in one loop per file or through the engine's narrowing (`ops=` for
BinOp, `callees=`/`methods=`), not by a check called on every node; facts worked out once per file or project
instead of once per question (the call sites joined once per project pass, the skipped roots once per
vocabulary, `uses()` from one prefix table); searches of the text only where a cheaper test of the question has
not already answered it (the call sites' evidence, the class pre-pass's headers, TD701's resume names, TD601's
mode layers); calls on no loop's lines not asked which loop holds them; assignments of constants and arithmetic
skipped by the binding pass.

Then the cross-file pre-pass of callers' argument kinds and factory returns (semantic/projectcalls.py) was merged
on top: main at the end of stop 30, 11.20 G bare, 17.15 G engine, **0.653**; with the checkp10 merge alone
(d93845e) 0.703 in the same session. On an idle machine, bench_check_cpu.py alternated: d93845e 0.62x and 0.59x,
stop 30's main 0.57x and 0.56x. The pre-pass costs about 0.10 CPU-s of the engine's ~1.5 over these 520 files
(reading every file a second time, and regular expressions over whole texts): the CPU-second target is met
without it and missed by about 0.04 with it.

Then (checkp11) the pre-pass made cheaper, findings unchanged (sorted JSON, info included, of torch's three trees as
one project and file by file, every fixture folder, 30 extracted repositories; and the pre-pass's tables): main
b6131b7 11.23 G bare, 16.94 G engine, **0.663**; h-checkp11 4fda17a 11.26 G, 16.37 G, **0.688** (the engine 3.4 %
fewer instructions; the pre-pass alone, measured apart over the same 520 files, 1.35 G -> 0.82 G). What moved it:
each file is read once, its bytes kept from the pre-pass for the analysis when it runs in one process
(`check.project_classes(..., sources)`, `engine.analyse_file(..., data)`); the searches of a whole text that were
tried at every line (imports, a function's `return`s) or every character (`^` in MULTILINE mode, for where a block
ends) are tried only at the lines that hold their word (str.find) or from the newline before a line; what a class
builds asked once per name for the project, not once per assignment; the assignment patterns possessive, so a
dotted name that fails is not given back part by part; module names worked out under roots resolved once (no stat
of every root for every file, no os.path.relpath); the file's text lowered once per file, not once by the call
sites and again by the resume words. bench_check_cpu.py --rounds 3 --no-torch, alternated, at load 6-11: main
0.55x, 0.57x, 0.48x, 0.50x, 0.55x and the branch 0.54x, 0.56x, 0.53x, 0.54x, 0.55x: inside the load's noise. By
the instruction figures the CPU-second target is still short by about 0.02 (0.663 was ~0.565x idle; 3.4 % fewer
instructions, many of them the regular-expression engine's C, is ~0.58x). Where the rest is, in instructions of
the engine's 16.4 G: the call sites left for the project pass 1.0 G (of it, lowering and searching each text for
the evidence words ~0.24 G, the references handed as values 0.16 G, the context questions 0.23 G), TD205/TD210's
softmax facts 0.9 G, the pre-pass 0.8 G (the assignments of 351 files read for 15 that build an object of a known
kind: ~0.28 G). Tried and dropped: call sites only for names some project file defines (torch's tree defines nearly
every name it calls: no call skipped); one pass for every called name before the per-name call searches (a pattern
tried at every character cost more than the searches it spared).

Then (checkp12), findings unchanged (the same sorted JSON as checkp11's, info and the pre-pass's tables included:
torch's three trees as one project and file by file, every fixture folder, the same 30 extracted repositories):
main 0a12939 11.21 G bare, 16.46 G engine, **0.681**; h-checkp12 73850bb 11.24 G, 16.33 G, **0.688** (the engine
0.8 % fewer instructions; the first change alone, 4977349, 16.36 G). Most of what TD205/TD210's facts cost was not
the softmax questions: every name handed to a call of another module asked `_constructed_class`, whose first
question (`assigned_names`) built the file's scoped table of assignments (`defs`: every assignment sorted, its scope
looked up) for an answer that is nearly always None; that one question built the table in 254 of the 312 files that
ever built it, TD601's phase loops (`for batch in loader:`) in most of the rest. A name is now first looked up in one
unordered pass over the file's assignments (flow.py `assigned_values`, no scopes, no sort): handed to a call, only a
name some assignment gives a class call (or a model binding) goes on; a loop's iterable, only a name given a list or
tuple (or a parameter with a default); a criterion's input, only a name given a call. The table is built in 103
files. Also: a file that binds no cross-entropy or NLL loss skips the model-and-loss calls; TD608 filters the
file's names (37 % of its nodes) by imported root in C. Measured at 4568b85 by switching each part off (whole
processes, the same start-up in each): TD205/TD210's facts 0.61 G (checkp11: 0.9), the call sites 0.96 G. What is left
in the facts (cProfile, shares of ~1.7 s): `_built_classes` ~0.36 (each assignment's callee resolved, for names a
call might use as a loss), the criterion parameters ~0.28, `_constructed_model` ~0.43 (the unordered pass ~0.18), the
call loop ~0.23. The pre-pass's assignment reading (`projectcalls._kinds`) costs ~0.05 of cProfile's 37 s here, not
the ~0.28 G estimated before: not pursued.

Then the recall branches of stop 31 were merged on top (checkc12a: TD205 follows a model's output across files,
models chosen at run time and trainer classes; checkc12b: samplers and loaders from another file's factory). Main at
the end of stop 31 (6e3d565 + judged rows): 11.18 G bare, 16.90 G engine, **0.662**: the new facts took back what
checkp11 and checkp12 saved. bench_check_cpu.py --rounds 3 --no-torch at load 1.3-1.6, one after another: b6131b7
0.56x; h-checkp12 e95a1e8 0.57x, 0.57x; main 0.56x, 0.55x, 0.55x, 0.55x. Where the new cost sits (cProfile, main
against h-checkp12, spread thin): module_design's `_leave_softmax_facts` (+0.07 s of ~6.9), the bindings'
`_classify` and `scope_of` (+0.045 each), the pre-pass's `_lines_with` (+0.04).

Then (checkp13), findings unchanged (the same sorted JSON as checkp12's, info and the pre-pass's tables included:
torch's three trees as one project and file by file, 88 fixture folders, the same 30 extracted repositories; 120
files, `cmp` after every change): main df2a1bd 11.19 G bare, 16.88 G engine, **0.663**; h-checkp13 bc3acaa 11.22 G,
16.28 G, **0.689** (the engine 3.6 % fewer instructions; with PYTHONHASHSEED=0 for both, engine less start-up,
16.89 G and 16.28 G: runs without a fixed seed spread by about 0.03 G). bench_check_cpu.py --rounds 3 --no-torch,
alternated at load 4.8-5.4: main 0.62x, 0.49x, 0.55x, 0.51x and the branch 0.53x, 0.56x, 0.55x, 0.56x: inside
the load's noise. What moved it: questions answered once per file instead of once per node that asks them, and
loops over every call replaced by the calls index or skipped on a cheap test of the file. `assigned_names` is the
key set of the unordered pass over assignments (flow.py), so a name ruled out by it no longer builds the scoped
table `defs` (built in 279 files, then 152: TD205's trainer-receiver facts asked it of every `x.method(...)`, and
now ask `_constructed_class` only when some assignment of the receiver builds a class). The call sites' context
words (0.69 G of the sites' 0.96 G, measured by switching them off): `rank_guarded` answers each `if` test, each
block's first early exit and each function's decorators-or-callers once per file and mode (guards.py),
`grad_disabled` each `with` block, decorator set and function's callers (regions.py); the rank aliases are read
only in a file that spells `init_process_group` (an ASCII text: the parser normalises identifiers). Parameter
annotations resolved and classified once per spelling per file (0.29 G switched off: torch annotates hundreds of
parameters with a few types). The calls index instead of a loop over every call: TD608's deprecated arguments
(`calls_named`), the constructor calls of the file's classes, a criterion parameter's calls. TD807 reads the
calls' arguments only in a file that binds a generator-loss name; the names built from a class are read only for
names some call ends in; `.append`/`+=` kept arguments are read at the node, not by walking its subtree again.
Tried and dropped: each dotted spelling resolved once per file and `canonical` cached (16.271 G against 16.277 G,
same seed). What is left, switched off at d6ef938 (16.53 G): the call sites 0.92 G, of it the context words
0.46 G (the rest the loop over every call and its arguments). Those words are needed only for the functions the
project pass settles (4 facts ask them on torch's tree), but a file cannot know which while its tree is alive:
asking them on demand would mean the project pass reading the calling files again. Not done here.

Then the recall branches of stop 32 were merged on top (check13a/b/c: helpers' returns, mode layers across files,
graphreach, lossuse, schedule crossings, argparse defaults across files), none of which measured speed: main
1aa92c8 11.19 G bare, **24.17 G** engine, **0.463**. cProfile against h-checkp13 showed the new cost as a few per-file
questions asked of every file: the GPU-evidence regex (no literal prefix: tried at every character) moved before
TD507's early return, so every file paid it (0.24 s of ~3.5); the update-helper facts walked every method of every
class of a file that says `zero_grad` (torch's optim package: 0.18 s); graphreach walked the whole function for
each loss term's name, twice (0.09 s); the mode-layer regex over every text of the project (0.11 s). Gated, findings
unchanged (the same 120 captured files, `cmp`): a substring test ("cuda"/"nccl", "ropout"/"BatchNorm") before each
regex, methods walked only when their text holds `zero_grad` or `step`, one walk per scope for graphreach's
in-place rebinds and list growers. d52cf47: 11.20 G bare, 18.62 G engine, **0.601**; bench_check_cpu.py --rounds 3
--no-torch at load 0.3: **0.52x**. What is left above h-checkp13 (cProfile, ~0.2 s of ~3.6, spread thin): lossuse's
loss-code questions, TD205's factory facts, the schedule crossings, `names_a_gpu` on torch's cuda-heavy files.

Then (checkp14), findings unchanged (the same sorted JSON, info and the pre-pass's tables included: torch's three
trees as one project and file by file, every fixture folder, the same 30 extracted repositories; 334 files, `cmp`
after every change): main 8e9e895 11.18 G bare, 18.70 G engine, **0.598**; h-checkp14 eb7ba95 11.24 G bare, 16.57 G
engine, **0.678** (the engine 11.4 % fewer instructions). With the last change (0cb7b07): 11.23 G, 16.56 G,
**0.678**. bench_check_cpu.py --rounds 3 --no-torch, alternated: at load 15-22 (other helpers' valgrind runs and
probes on the 2 cores) main 0.50x, 0.52x and the branch 0.52x, 0.53x; at load 6-8 main 0.52x, 0.49x and the branch
(0cb7b07) 0.57x, 0.55x. Scaled from stop 32's 0.601 = 0.52x at load 0.3, 0.678 would be about 0.58x idle: an
estimate only (the regular expressions spared run at a higher rate per cycle than the Python spared), not measured
here. What moved it: work every file paid for the few files that need it, now gated on a cheap test of the file or
read from the calls index. `names_a_gpu` (TD507's and other rules' GPU evidence, asked of every file): its regex has
no literal prefix, so searching a whole text tried it at every character of every file that says "cuda" anywhere
(most of torch's); it is now tried only on the lines holding "cuda" or "nccl", with the line's bounds handed to
`search` (no spelling spans a newline: the same answer on 15,296 files of torch and the extracted repositories),
about 3 % of the engine's CPU time. `ClassInfo.methods` built its table at every `method(...)` question (every
`self.x(...)` call the bindings and loops follow): once per class. Asked per function or per class, read once per
file: lossuse's holders (names and tables holding a function), the update helpers' methods (from the
`.zero_grad`/`.step` calls of the index, not a walk of every method whose text says "step": every optimizer of
torch's), a registrar's calls (the method-calls index), debugging's calls by function (the index's `calls_in` table,
built the same way), autograd's trainable attributes (one walk of the class for the numbers and the `self.x` names,
not two). `name_kind` (four case-blind regex searches) answered once per spelling. Loops over every call of a file
replaced by the calls index: the file's own functions and methods (`_local_function_calls`, from the names of its
functions, nested functions and methods; every call only when an import claims one of those names), TD205's loss
kinds when no loss module is bound and no local class wraps one (the functional losses' calls), TD406/TD407's
scheduler constructions (the names `resolve` files under a scheduler prefix or factory). Skipped on a test of the
text (ASCII texts only: the parser normalises identifiers): a bare `set_device(...)`, TD707's optimizer writes and
reads ("save"; "load", "resume", "restore"), schedules of other modules ("sched"), `next(iter(loader))`; TD205's
softmax factories in a file that calls no nn.Softmax and no nn.Sequential (each module-level function's returned
names were followed, building the file's table of assignments). What is left (cProfile, shares of the engine):
TD205's facts ~8 % (the loop over every call for models handed to other modules' functions and methods), the call
sites ~7 %, TD608's scan of every name for imported roots ~3 %, the walk ~8 % (tried: no visit of nodes without
children, 2 % of the walk: not kept), the bindings ~6 %.

Then (checkp15), findings unchanged (the same sorted JSON, info and the pre-pass's tables included: torch's three
trees as one project and file by file, every fixture folder, the same 30 extracted repositories; 454 files, `cmp`
after every change, both sides with PYTHONHASHSEED=0: TD602 on tests/fixtures/run/eval_steps_without_backward.py
comes and goes with the hash seed on main itself, see below): main ddf73ef 11.22 G bare, 16.56 G engine, **0.678**,
and again, run beside the branch, 11.21 G, 16.60 G, **0.675**; h-checkp15 eed9f2a 11.18 G bare, 16.17 G engine,
**0.692** (the engine 2.5 % fewer instructions). bench_check_cpu.py --rounds 3 --no-torch, alternated at load
7.5-8: main 0.53x, 0.53x and the branch 0.54x, 0.52x (at load 15-19: 0.51x, 0.50x and 0.49x, 0.50x): inside the
load's noise, and short of 0.6x. What moved it: work asked once per file or per spelling instead of once per
question, and lookups a cheap test answers first. `uses(prefix)` (the router's contexts, the framework lookups, the
Lightning tests) built a set of every dotted prefix of every name imported or called; it is now one sorted list
and a binary search (a prefix is used when some name is it or starts with it and a dot). `framework_call`, asked of
every assignment of a call's value by the bindings, looks up the receiver's framework only for a method some
framework lists under the role (`setup`: one name). The calls index qualifies each spelling once per file
(`torch.cat`, `self.conv` are called hundreds of times). The call sites' handed references (`register(self.x)`)
resolve nothing for an attribute of a root no import names, without the lookup. The semantic model and the rules
outside the project-consistency helper's files (checkpointing, debugging, distributed, memory) walk subtrees
with `subtree()` (ast.walk's nodes in ast.walk's order, about two thirds of its cost). The file's assignments are
sorted into source order once (`assignments_in_order`), not by each of the bindings, the scoped table `defs`, the
classes' `self.x = ...` and the late copies; the schedule crossings read the text lowered once per file
(`index.lowered()`) instead of lowering it again. What is left, by the same shares as checkp14's: TD205's facts
~6 %, the call sites ~6 % (of 38,332 calls in the corpus, 31,260 have arguments read for handed references and
6,563 reach the context questions, 3,331 distinct callees), TD608 ~3 % (26,190 names of an imported root, whose
attribute chains are climbed: 13,623 steps; inverting it over the 3,800 attributes with a deprecated last name
would spare little once the Attribute nodes are collected by the walk: not done), the walk ~9 %, the index ~14 %.
Tried and dropped: the walk with per-class generated code for each node type's children (0.174-0.180 s against
0.180-0.182 s per round: no gain); the parent kept on each node instead of a table (each child then refers to its
parent: the tree is freed only by the cyclic collector). Seen, not explained: the per-rule CPU timing puts ~0.15 s
more on TD101 when it runs first than its own ~0.06 s when it runs last, and the total of all rules ~0.1 s lower
with TD101 last, yet valgrind counts the same instructions in both orders (19.146 G and 19.143 G): a cache or
timing effect, not work that could be skipped. TD602's hash-seed dependence: `_stale_eval` (debugging.py) returns
the first model of a step's key set (a frozenset) whose `.eval()` is still in force; with two stale models
(`encoder`, `head`) the set's order picks one, and `head` (a plain Linear: `model_mode_layers` is False) drops the
finding that `encoder` (with Dropout) keeps. Not changed here (the findings must not change): for the rule's owner.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_SIDE = """
import sys
sys.path.insert(0, {here!r})
import bench_check_cpu as b
files = b.corpus(import_torch=False)
b.engine(files[:20])
b.bare(files[:20])
if {side!r} == "bare":
    b.bare(files)
elif {side!r} == "engine":
    b.engine(files)
"""
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(python: str, side: str) -> int:
    proc = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", python, "-c",
         _SIDE.format(here=str(HERE), side=side)],
        capture_output=True, text=True,
    )
    found = _REFS.search(proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"bench_check_instructions: the {side} run failed: {proc.stderr.strip()[-300:]}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torchdoctor is measured")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench_check_instructions: valgrind is not installed", file=sys.stderr)
        return 2
    start = instructions(args.python, "start")
    bare = instructions(args.python, "bare") - start
    engine = instructions(args.python, "engine") - start
    print(f"bare parse+walk: {bare / 1e9:.2f} G instructions  engine, all rules + project pass: {engine / 1e9:.2f} G  "
          f"ratio: {bare / engine:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
