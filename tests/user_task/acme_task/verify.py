"""Acme's rewards: an answer is right when it contains the gold answer (case-insensitive), and
a web sub-agent's result is worth something when it is a non-empty, non-error observation."""

from __future__ import annotations


def contains_gold(question: str, answer: str, gold: str) -> float:
    return float(bool(gold.strip()) and gold.strip().lower() in answer.lower())


def useful_result(role: str, task: str, result: str) -> float:
    return float(bool(result.strip()) and not result.startswith("error"))
