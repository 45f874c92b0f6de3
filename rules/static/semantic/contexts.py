"""Setup facts for the router: distributed, amp, compile, gpu, custom autograd, training frameworks."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


_DEVICE_STRING = re.compile(r"""cuda(?::\d+)?["']""")


def _mentions_gpu(text: str) -> bool:
    """`.cuda(` or a quoted device string (`"cuda"`, `'cuda:0'`). Two plain searches and a regex anchored on the
    literal `cuda`: one alternation over the whole text cost more than the rest of this module."""
    if "cuda" not in text:
        return False
    if ".cuda(" in text:
        return True
    return any(m.start() > 0 and text[m.start() - 1] in "\"'" for m in _DEVICE_STRING.finditer(text))


class Contexts:
    """Facts about the whole file that choose advice."""

    def uses_accelerate(self) -> bool:
        """An `accelerate.Accelerator` is built: it places each process on its own GPU when there is one."""
        return bool(self.calls_to("accelerate.Accelerator"))

    def contexts(self) -> set[str]:
        """Setup facts for the router (routing.toml [[context]]); worked out once per file (the engine asks for
        the router, the call sites ask whether the file runs as several processes), a copy each time."""
        if self._contexts is None:
            self._contexts = frozenset(self._work_out_contexts())
        return set(self._contexts)

    def _work_out_contexts(self) -> set[str]:
        out: set[str] = set()
        if (
            self.uses("torch.distributed")
            or any(b.wrapper in ("ddp", "fsdp") for b in self.bindings_of("module"))
            or self.calls_to(*sorted(self.names["ddp"] | self.names["fsdp"]))
        ):
            out.add("distributed")
        if self.bindings_of("scaler") or self.autocast_regions() or self.calls_to(
            *sorted(self.names["autocast"] | self.names["scalers"])
        ):
            out.add("amp")
        if self.calls_to(*sorted(self.names["compile"])):
            out.add("compile")
        if _mentions_gpu(self.source):
            out.add("gpu")
        if self.function_classes:
            out.add("custom-autograd")
        # Training frameworks (frameworks.toml): the advice names their knobs first.
        if self.uses("lightning") or self.uses("pytorch_lightning"):
            out.add("lightning")
        if self.calls_to("transformers.Trainer", "transformers.TrainingArguments", "transformers.Seq2SeqTrainer",
                         "transformers.Seq2SeqTrainingArguments"):
            out.add("hf-trainer")
        if self.uses_accelerate():
            out.add("accelerate")
        return out
