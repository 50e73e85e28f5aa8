"""How much of a conversation's history a `previous_response_id` follow-up reuses on the embedded engine.

    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.responses.follow_up_kv [--conversations 6]

Each conversation is a chain of Responses requests (greedy, short answers), every turn after the first
naming the previous one. For each follow-up, reuse = its `input_tokens_details.cached_tokens` over the
history it continues (the previous turn's input and output tokens). Floor (issue 19): >= 90%.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import openai

from adapters.local import LocalEngineConfig
from proxy.app import create_app
from proxy.routing.from_settings import build_pool
from proxy.settings import Settings
from tests.gateway_server import GatewayServer

SHORT_INSTRUCTIONS = "You are a patient geography tutor. Answer each question in one or two sentences."
INSTRUCTIONS = (
    SHORT_INSTRUCTIONS
    + " The student is preparing for a school exam about European countries, their capitals, rivers,"
    " landmarks and languages. Keep every answer factual and short, and never invent facts: when you are"
    " not sure, say so plainly. Use simple words that a twelve-year-old understands, and avoid lists,"
    " tables and headings. When a question builds on an earlier one, answer it about the country the"
    " conversation is about. If the student asks about something outside geography, steer the"
    " conversation back politely. Spell place names the way an English atlas spells them, and give"
    " distances in kilometres and heights in metres. Do not repeat the question before answering it,"
    " and do not end with a question of your own. Remember that the student reads your answers on a"
    " small phone screen, so every word should count. Praise a good question only rarely, and never"
    " at the start of an answer."
)
QUESTIONS = (
    "What is the capital of {c}?",
    "Which river flows through it?",
    "Name a famous building there.",
    "What language do people speak there?",
)
COUNTRIES = ("France", "Italy", "Spain", "Germany", "Portugal", "Austria", "Poland", "Greece")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--max-output-tokens", type=int, default=48)
    parser.add_argument("--short", action="store_true", help="one-sentence instructions (short histories)")
    args = parser.parse_args()
    settings = Settings(local_engine=LocalEngineConfig())
    server = GatewayServer(create_app(settings, router=build_pool(settings))).start()
    reuse: list[float] = []
    turns: list[list[int]] = []
    """(history tokens, cached tokens) per follow-up."""
    try:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)
        model = settings.local_engine.model_id
        for country in COUNTRIES[: args.conversations]:
            previous = None
            for question in QUESTIONS:
                response = client.responses.create(
                    model=model,
                    instructions=SHORT_INSTRUCTIONS if args.short else INSTRUCTIONS,
                    input=question.format(c=country),
                    previous_response_id=previous.id if previous is not None else None,
                    temperature=0,
                    max_output_tokens=args.max_output_tokens,
                )
                assert response.usage is not None
                if previous is not None and previous.usage is not None:
                    history = previous.usage.input_tokens + previous.usage.output_tokens
                    reuse.append(response.usage.input_tokens_details.cached_tokens / history)
                    turns.append([history, response.usage.input_tokens_details.cached_tokens])
                previous = response
    finally:
        server.stop()
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "cpu": platform.processor() or platform.machine(),
                "follow_ups": len(reuse),
                "reuse_min": round(min(reuse), 4),
                "reuse_p50": round(statistics.median(reuse), 4),
                "reuse_mean": round(statistics.fmean(reuse), 4),
                "reuse_overall": round(sum(c for _, c in turns) / sum(h for h, _ in turns), 4),
                "instructions": "short" if args.short else "long",
                "history_and_cached": turns,
            }
        )
    )


if __name__ == "__main__":
    main()
