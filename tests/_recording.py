"""An ``ATACTrainer`` that records the ``input_ids`` of every training micro-batch it shards.

Shared by the trainer data tests (streaming, resume, exactly-once): ``trainer.seen`` lists
``(global_step, input_ids of the micro-batch)`` in the order the micro-batches were trained.
"""

from __future__ import annotations

from typing import Any


def recording_trainer(model: Any, args: Any, train_dataset: Any, atac_config: Any):
    """An ``ATACTrainer`` over ``train_dataset`` with ``seen`` (see the module) and no printer."""
    from transformers import PrinterCallback

    from atac_hf.integrations import ATACTrainer

    class Recording(ATACTrainer):
        def _prepare_context_parallel_inputs(self, model, inputs):
            if model.training:
                self.seen.append((self.state.global_step, inputs["input_ids"].reshape(-1).tolist()))
            return super()._prepare_context_parallel_inputs(model, inputs)

    trainer = Recording(model=model, args=args, train_dataset=train_dataset, atac_config=atac_config)
    trainer.remove_callback(PrinterCallback)
    trainer.seen = []
    return trainer
