"""TRL side of ``bench/grpo_step.py``: TRL's ``GRPOTrainer`` on the same tiny model, stepped
on command so the parent can alternate it with ours.

Runs in its own venv (``.venv-trl``, TRL 1.16; see ``bench/grpo_step.py``), never the main
one. Protocol: before each optimizer step the trainer reads one line from stdin; after it,
it prints ``STEP <seconds>`` (generation + update: TRL generates inside the step). Args:
MODEL_DIR STEPS G P L PROMPTS_JSON.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    folder, steps, group, prompts_n, length, prompts_json = sys.argv[1:7]
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    prompts = [tok.decode(p) for p in json.loads(prompts_json)]
    group, length = int(group), int(length)

    def even_share(completions, completion_ids=None, **kwargs):
        if completion_ids is None:
            completion_ids = [tok(c)["input_ids"] for c in completions]
        return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]

    class Pace(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            sys.stdin.readline()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            print(f"STEP {time.perf_counter() - self.start}", flush=True)

    config = GRPOConfig(
        output_dir=folder + "-trl", per_device_train_batch_size=group * int(prompts_n),
        gradient_accumulation_steps=1, num_generations=group, max_completion_length=length,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, num_iterations=1, learning_rate=1e-5,
        generation_kwargs={"min_new_tokens": length}, use_cpu=True, report_to="none",
        logging_steps=10_000, save_strategy="no", max_steps=int(steps), seed=0,
        dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=even_share, args=config,
                          train_dataset=Dataset.from_dict({"prompt": prompts}),
                          processing_class=tok, callbacks=[Pace()])
    trainer.train()


if __name__ == "__main__":
    main()
