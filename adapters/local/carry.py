"""The carry policy of a windowed chat: which spans of its prompt the sliding window never cuts.

A chat that runs past its window still sees its instructions and the question:

- the system prompt (the leading `system` / `developer` messages) is kept with the attention
  sinks, as the head of the kept cache;
- the latest user turn is pinned: its pages stay, whole, once the window slides past them.

Each is kept only when it is at most half the window long (a longer one slides like any other
text; bounded memory comes first) and its tokens are a prefix-stable span of the prompt (the
template renders the messages before it to exactly the prompt's first tokens). The spans are
found by rendering the messages before and through each span with the same template.
"""

from __future__ import annotations

from collections.abc import Sequence

from adapters.local.chat_template import ChatTemplate
from adapters.local.tokenizer import TextTokenizer
from adapters.local.window import Carry
from adapters.schema import ChatMessage

SYSTEM_ROLES = frozenset({"system", "developer"})


def carry_spans(
    messages: Sequence[ChatMessage],
    prompt: list[int],
    tokenizer: TextTokenizer,
    template: ChatTemplate,
    window_size: int,
) -> Carry:
    """The head (system prompt) and pinned span (latest user turn) of `prompt` to keep whole."""
    limit = window_size // 2

    def prefix(count: int) -> int | None:
        """Tokens of the first `count` messages, when the prompt starts with exactly them."""
        if count == 0:
            return 0
        tokens = tokenizer.encode(template.render(messages[:count], add_generation_prompt=False))
        return len(tokens) if prompt[: len(tokens)] == tokens else None

    systems = 0
    while systems < len(messages) and messages[systems].role in SYSTEM_ROLES:
        systems += 1
    head = prefix(systems) or 0
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    start = end = 0
    if users:
        first, last = prefix(users[-1]), prefix(users[-1] + 1)
        if first is not None and last is not None and 0 < last - first <= limit:
            start, end = first, last
    return Carry(head=head if head <= limit else 0, pin_start=start, pin_end=end)
