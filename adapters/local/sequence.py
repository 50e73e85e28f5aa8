"""Request and sequence state as the scheduler sees it: token ids, page ids, progress.

A `GenerationJob` is one API request, built on the event loop and handed to the engine thread.
It holds one `PromptGroup` per prompt (completions accept several); each group becomes `n`
`Sequence`s, one per choice. The first sequence of a group prefills the prompt; the others
wait in `forks` and, once the prompt's KV exists, share its pages (see Scheduler.fork).

What flows back is `ChoiceDelta`s: new text, logprobs and, at the end, the finish reason and
token counts of one choice.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from adapters.errors import EngineError
from adapters.local.drafts import DraftState

if TYPE_CHECKING:
    from adapters.local.beam_group import BeamGroup
from adapters.local.grammar import GrammarState, OutputGrammar
from adapters.local.sampling import SamplerState, SamplingParams, TokenLogprob
from adapters.local.text_stream import TextStream
from adapters.local.window import Carry, WindowSpec, WindowState
from cachelayer.radix import RadixNode


@dataclass(slots=True)
class ChoiceDelta:
    """What one choice produced in one scheduler step."""

    index: int
    token_id: int
    """The token sampled this step."""
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    """Set on the final delta: tokens this choice generated."""
    cached_tokens: int = 0
    """Set on the final delta of a group's first choice: prompt tokens served from the prefix cache."""
    accepted_drafts: int = 0
    """Set on the final delta of a choice that speculated: draft tokens the model agreed with."""
    rejected_drafts: int = 0
    """Set on the final delta of a choice that speculated: draft tokens the model disagreed with."""


@dataclass(slots=True)
class JobFailed:
    """The engine could not finish the job; the stream reports this error."""

    error: EngineError


JobEvent = ChoiceDelta | JobFailed
Sink = Callable[[list[JobEvent]], None]
"""Called on the engine thread with one step's events; must be thread-safe and never block."""


@dataclass(slots=True)
class PromptGroup:
    """One prompt and the choice indices its `n` completions answer with."""

    prompt: list[int]
    first_index: int
    n: int
    carry: Carry | None = None
    """What of a windowed chat prompt its window never cuts (`adapters.local.carry`)."""


@dataclass(slots=True)
class GenerationJob:
    """One request, ready for the engine thread."""

    job_id: int
    groups: list[PromptGroup]
    params: SamplingParams
    salt: str
    sink: Sink
    speculate: bool = False
    """Draft and verify several tokens a step where the sampling allows (`adapters.local.drafts`)."""
    submitted_at: float = field(default_factory=time.monotonic)
    """When the request was handed to the engine (its queue time starts here)."""
    grammar: OutputGrammar | None = None
    """The grammar every choice's output must follow (`adapters.local.grammar`); None: free."""
    window: WindowSpec | None = None
    """Attend with sinks and a sliding window (`adapters.local.window`); None: to every token."""


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


class Sequence:
    """One choice being generated: its tokens, pages, sampler and text state."""

    __slots__ = (
        "admitted_at",
        "beam",
        "cached_tokens",
        "choice_index",
        "draft",
        "finish_reason",
        "forks",
        "grammar",
        "job",
        "last_token_at",
        "lock",
        "num_computed",
        "pages",
        "prompt_len",
        "queued_at",
        "reports_cache",
        "sampler",
        "seq_id",
        "spec",
        "status",
        "text",
        "tokens",
        "window",
    )

    def __init__(
        self,
        job: GenerationJob,
        prompt: list[int],
        choice_index: int,
        sampler: SamplerState,
        text: TextStream,
    ) -> None:
        self.seq_id = next(_ids)
        self.job = job
        self.choice_index = choice_index
        self.tokens = list(prompt)
        self.prompt_len = len(prompt)
        self.sampler = sampler
        self.text = text
        self.pages: list[int] = []
        self.num_computed = 0
        """Leading tokens whose K/V is in `pages`."""
        self.cached_tokens = 0
        self.reports_cache = False
        """True for the group's first choice, which reports the group's cached tokens."""
        self.lock: RadixNode[int] | None = None
        """The radix node locked while this sequence uses the cached pages under it."""
        self.window: WindowState | None = None
        """Set by the scheduler for a windowed job: which tokens are kept, at which positions."""
        self.forks: list[Sequence] = []
        """Sibling choices waiting for this sequence's prompt KV."""
        self.beam: BeamGroup | None = None
        """The beam search this sequence is a beam of (`adapters.local.beam_group`)."""
        self.spec: DraftState | None = None
        """Drafting state, for a sequence that speculates."""
        self.draft: list[int] = []
        """Tokens this step verifies after the sequence's last one (their K/V is computed with it)."""
        self.grammar: GrammarState | None = job.grammar.start() if job.grammar is not None else None
        """This choice's place in the job's grammar, advanced by every sampled token."""
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.admitted_at = 0
        self.queued_at: float | None = job.submitted_at
        """Cleared at the first admission, when the queue time is taken (a preemption's wait is not)."""
        self.last_token_at = 0.0
        """`time.monotonic()` of the latest token (for the inter-token latency)."""

    @property
    def params(self) -> SamplingParams:
        return self.job.params

    @property
    def salt(self) -> str:
        return self.job.salt

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def remaining(self) -> int:
        """Tokens whose K/V must be computed before the next sample (1 when decoding)."""
        return len(self.tokens) - self.num_computed

    @property
    def in_prefill(self) -> bool:
        """More than one token to compute: a prompt, or a preempted sequence coming back."""
        return self.remaining > 1
