"""The training reader one optimizer step ahead: the next step's micro-batches are read, counted and sent to the
device while the device still runs the current step.

Reading a step's batches (packing, masking, document ids: 6-25 ms per 8,192 tokens on one core) used to happen
after the previous step's results were read back, with the device idle (docs/gpu.md).
The trainer now queues step N's kernels, then reads step N+1's batches, then waits for step N's sums.

The reader's position is what checkpoints record, so `state_dict` is the position *before* the batches read
ahead: a checkpoint taken between the two steps resumes at step N+1 and reads the same batches again. Anything
that moves the reader otherwise (a checkpoint load, a skip, a stage's mask rate / mixture / document view) first
puts the read-ahead back, so the stream is exactly the one read without it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class StepBatches:
    """One optimizer step's micro-batches, as the trainer uses them."""

    prepared: object
    """What the caller's `prepare` made of the host batches (the trainer: counts and device copies)."""
    tokens_by_source: dict[str, int]
    """Non-padding tokens drawn from each source over all ranks (PretrainBatches.next_batches)."""


Prepare = Callable[[list], object]
"""What the caller makes of a step's host micro-batches (kept in StepBatches.prepared)."""


class ReadAhead:
    """Wraps a PretrainBatches reader (the same methods) and holds at most one step read ahead."""

    def __init__(self, reader):
        self.reader = reader
        self._ahead: tuple[tuple[int, int, int], dict, StepBatches] | None = None
        """(seq_len, micro_batch_size, count) read, the reader's state before them, the step's batches."""

    def step_batches(self, seq_len: int, micro_batch_size: int, count: int, prepare: Prepare) -> StepBatches:
        """`count` micro-batches of one step: the ones read ahead when they are of this shape, else read now
        (and made into `prepare(host batches)`)."""
        if self._ahead is not None and self._ahead[0] == (seq_len, micro_batch_size, count):
            batches, self._ahead = self._ahead[2], None
            return batches
        self.put_back()
        return self._read(seq_len, micro_batch_size, count, prepare)

    def read_ahead(self, seq_len: int, micro_batch_size: int, count: int, prepare: Prepare) -> None:
        """Read and prepare the next step's batches now; the reader's state stays the one before them."""
        self.put_back()
        state = self.reader.state_dict()
        self._ahead = ((seq_len, micro_batch_size, count), state,
                       self._read(seq_len, micro_batch_size, count, prepare))

    def put_back(self) -> None:
        """Undo the read-ahead (its batches are read again when asked for)."""
        if self._ahead is not None:
            state, self._ahead = self._ahead[1], None
            self.reader.load_state_dict(state)

    def _read(self, seq_len: int, micro_batch_size: int, count: int, prepare: Prepare) -> StepBatches:
        host, tokens_by_source = self.reader.next_batches(seq_len, micro_batch_size, count)
        return StepBatches(prepare(host), tokens_by_source)

    # The reader's state and settings, as the checkpointer and the trainer use them.
    def state_dict(self) -> dict:
        return self._ahead[1] if self._ahead is not None else self.reader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._ahead = None
        self.reader.load_state_dict(state)

    def skip(self, seq_len: int, sequences: int) -> None:
        self.put_back()
        self.reader.skip(seq_len, sequences)

    def set_mask_prob(self, mask_prob: float) -> None:
        self.put_back()
        self.reader.set_mask_prob(mask_prob)

    def set_mixture(self, mixture) -> None:
        self.put_back()
        self.reader.set_mixture(mixture)

    def set_document_view(self, view) -> None:
        self.put_back()
        self.reader.set_document_view(view)

    def __getattr__(self, name: str):  # read-only facts of the reader (corpus, source_names, ...)
        return getattr(self.reader, name)
