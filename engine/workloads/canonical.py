"""Canonical workloads: bundled chat prompts and seeded output-length distributions.

One place defines them so the benchmarks, the traffic generator and the lessons replay the same
traffic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

CHAT_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Explain what a hash table is in two sentences.",
    "Write a haiku about the sea.",
    "Give me three tips for a job interview.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish and Portuguese.",
    "What is the difference between a virus and a bacterium?",
    "Summarize the plot of Romeo and Juliet.",
    "How do I boil an egg?",
    "Name five planets of the solar system.",
    "What does a CPU do?",
    "Suggest a name for a small bakery.",
    "How many legs does a spider have?",
    "Write a short thank-you note to a teacher.",
    "What is photosynthesis?",
    "Give an example of a prime number greater than 50.",
    "What is the tallest mountain on Earth?",
    "Describe a cat to someone who has never seen one.",
    "How can I save money on groceries?",
    "What is the boiling point of water in Fahrenheit?",
    "Tell me a fun fact about octopuses.",
    "What is machine learning?",
    "Write a two-line poem about coffee.",
    "Why do leaves change color in autumn?",
    "What is the Pythagorean theorem?",
    "List three healthy breakfast ideas.",
    "Who painted the Mona Lisa?",
    "How does a rainbow form?",
    "What is the largest ocean?",
    "Give me a tip for learning a new language.",
    "What is an API?",
    "Explain gravity to a child.",
)

# A long passage for prompts that must cost a real prefill (the stall lesson and benchmark).
LONG_CONTEXT = (
    "The following is a report from a small city's public transport office. Buses run on twelve "
    "routes from five in the morning until midnight. Ridership grew during the spring, mostly on "
    "the routes that serve the university and the hospital, while the industrial routes lost "
    "passengers after two factories moved away. The office tested a new timetable with buses every "
    "eight minutes at rush hour, replaced thirty old vehicles with electric ones, and opened a "
    "night line on weekends. Complaints dropped on punctuality but rose on crowding, especially "
    "on the lines that cross the river, where the bridge works slowed every trip by several "
    "minutes. The council asked for a plan that balances cost, coverage and comfort for next year. "
)


# The "mixed" prompt set, one definition for the live traffic and the lessons' workloads: each
# prompt is a long report (a real prefill) with this probability, a chat question otherwise.
MIXED_LONG_SHARE = 0.25


def mixed_is_long(rng: random.Random) -> bool:
    """One draw of the "mixed" prompt set: True for a long prompt (25 % of them)."""
    return rng.random() < MIXED_LONG_SHARE


@dataclass(frozen=True, slots=True)
class WorkItem:
    prompt: str
    max_new_tokens: int
    arrival_s: float = 0.0


def lognormal_lengths(
    n: int, median: float = 40.0, sigma: float = 1.0, lo: int = 8, hi: int = 256, seed: int = 0
) -> list[int]:
    rng = random.Random(seed)
    import math

    mu = math.log(median)
    return [int(min(hi, max(lo, round(rng.lognormvariate(mu, sigma))))) for _ in range(n)]


def batching_workload(n: int = 32, seed: int = 0) -> list[WorkItem]:
    """``n`` chat requests arriving at once; output lengths lognormal (median 40, sigma 1, [8,
    256])."""
    lengths = lognormal_lengths(n, seed=seed)
    return [WorkItem(CHAT_PROMPTS[i % len(CHAT_PROMPTS)], lengths[i]) for i in range(n)]


def long_prompt(target_tokens: int, tokenizer, index: int = 0) -> str:
    """A prompt of about ``target_tokens`` tokens: the report repeated, then a question."""
    question = f"Question {index}: what should the council do first, and why?"
    text = ""
    while len(tokenizer.encode(text + question)) < target_tokens:
        text += LONG_CONTEXT
    words = text.split(" ")
    while len(words) > 1 and len(tokenizer.encode(" ".join(words) + question)) > target_tokens:
        words = words[:-8]
    return " ".join(words) + "\n" + question
