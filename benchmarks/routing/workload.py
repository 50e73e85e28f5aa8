"""Workloads for the routing benchmark, over a word-level vocabulary where one word is one token.

The gateway and the simulated workers load the same `tokenizer.json` (a `tokenizers` WordLevel model
written by `write_word_tokenizer`), so "a 2,048-token system prompt" is exactly 2,048 tokens on
both sides, and text the workers generate round-trips through the next turn's prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from proxy.routing.tokenizing import CHAT_END, CHAT_START

VOCAB_WORDS = 8_000


def word(i: int) -> str:
    """The i-th vocabulary word: lowercase letters only (the simulator generates from these)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = ""
    i += 26 * 27  # at least three letters, so no word collides with a short English word
    while i:
        i, r = divmod(i, 26)
        out = letters[r] + out
    return out


def write_word_tokenizer(path: Path) -> Path:
    """Write a WordLevel tokenizer.json: whitespace-split words, ChatML markers as tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0}
    for marker in ("system", "user", "assistant"):
        vocab[f"{CHAT_START}{marker}"] = len(vocab)
    vocab[CHAT_END] = len(vocab)
    for i in range(VOCAB_WORDS):
        vocab[word(i)] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(CHAT_END, behavior="isolated")]
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins tokens with single spaces
    tokenizer.save(str(path))
    return path


def words(rng: random.Random, n: int) -> str:
    """`n` random vocabulary words, separated by spaces: exactly `n` tokens."""
    return " ".join(word(rng.randrange(VOCAB_WORDS)) for _ in range(n))


@dataclass(slots=True)
class Request:
    """One benchmark request: chat messages, a token budget, and the group it belongs to."""

    messages: list[dict[str, str]]
    max_tokens: int
    group: int


@dataclass(slots=True)
class Conversation:
    """A multi-turn chat: each turn appends the user's question and the assistant's answer."""

    system: str
    questions: list[str]
    max_tokens: int
    group: int
    history: list[dict[str, str]] = field(default_factory=list)

    def turn(self, index: int) -> Request:
        """The request of turn `index` (history must hold the previous turns' answers)."""
        messages = [{"role": "system", "content": self.system}, *self.history]
        messages.append({"role": "user", "content": self.questions[index]})
        return Request(messages=messages, max_tokens=self.max_tokens, group=self.group)

    def answered(self, index: int, answer: str) -> None:
        """Record turn `index`'s answer in the history."""
        self.history += [
            {"role": "user", "content": self.questions[index]},
            {"role": "assistant", "content": answer},
        ]


def generated_shared_prefix(
    seed: int,
    groups: int = 64,
    per_group: int = 16,
    system_len: int = 2048,
    question_len: int = 128,
    output_len: int = 256,
) -> list[Request]:
    """SGLang bench_serving's generated-shared-prefix: groups of prompts sharing a system prompt, shuffled."""
    rng = random.Random(seed)
    requests = []
    for g in range(groups):
        system = words(rng, system_len)
        for _ in range(per_group):
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": words(rng, question_len)},
            ]
            requests.append(Request(messages=messages, max_tokens=output_len, group=g))
    rng.shuffle(requests)
    return requests


def skewed_popularity(
    seed: int,
    groups: int = 64,
    requests: int = 1024,
    hottest_share: float = 0.25,
    system_len: int = 2048,
    question_len: int = 128,
    output_len: int = 256,
) -> list[Request]:
    """Groups sharing a system prompt, with skewed popularity: the hottest group carries
    `hottest_share` of all requests, the others a Zipf (1/rank) share of the rest; shuffled."""
    rng = random.Random(seed)
    systems = [words(rng, system_len) for _ in range(groups)]
    tail = [1 / rank for rank in range(2, groups + 1)]
    weights = [hottest_share * sum(tail) / (1 - hottest_share), *tail]
    picks = rng.choices(range(groups), weights=weights, k=requests)
    return [
        Request(
            messages=[
                {"role": "system", "content": systems[g]},
                {"role": "user", "content": words(rng, question_len)},
            ],
            max_tokens=output_len,
            group=g,
        )
        for g in picks
    ]


def no_sharing(seed: int, count: int = 256, prompt_len: int = 2176, output_len: int = 256) -> list[Request]:
    """The control: every prompt unique from its first token."""
    rng = random.Random(seed)
    return [
        Request(
            messages=[{"role": "user", "content": words(rng, prompt_len)}], max_tokens=output_len, group=i
        )
        for i in range(count)
    ]


def multi_turn(
    seed: int,
    conversations: int = 48,
    turns: int = 5,
    system_len: int = 2048,
    question_len: int = 128,
    output_len: int = 128,
) -> list[Conversation]:
    """Conversations that all share one system prompt and carry their history."""
    rng = random.Random(seed)
    system = words(rng, system_len)
    return [
        Conversation(
            system=system,
            questions=[words(rng, question_len) for _ in range(turns)],
            max_tokens=output_len,
            group=c,
        )
        for c in range(conversations)
    ]
