"""The epochs ``mirrorfit.fit`` reads: one Keras data adapter, read as Keras's ``EpochIterator``
reads it, its batches padded to the global batch (:mod:`mirrorfit.fitting.batches`)."""

from __future__ import annotations

from mirrorfit.errors import FitError
from mirrorfit.fitting import batches as fit_batches


_END = object()  # the source's iterator ran out


class Epochs:
    """One epoch of batches at a time from ``source`` (a Keras data adapter). ``steps``
    (``steps_per_epoch``): that many batches an epoch, read on from where the last stopped (a
    source that runs out ends its epoch, starts over in the next), else one pass; ``restart``:
    every pass from the start, as Keras's ``evaluate`` resets its iterator (``fit``'s
    validation with ``validation_steps`` scores the same batches each epoch). ``pad``: pad to
    the global batch (else as given, for a model's own ``train_step``). ``first``: the first batch,
    kept for epoch 1 (the model is built from it); ``size``: the global batch; ``zeros``: pad
    with zeros, not copies of the last example (a model whose outputs carry a Keras mask:
    zeros are masked steps, left out of each replica's count); ``round_up``: a batch size that
    does not split over the replicas is padded to one that does (evaluation: no update).
    ``read_again``: the Keras adapters' class names that epoch 1 reads anew after the build.
    """

    def __init__(
        self,
        source,
        batch_size,
        steps,
        *,
        replicas: int,
        accum_steps: int = 1,
        drop_remainder: bool = False,
        pad: bool = True,
        restart: bool = False,
        zeros: bool = False,
        round_up: bool = False,
        where: str = "training data",
        read_again: frozenset = frozenset(),
    ) -> None:
        self.source, self.steps_given, self.drop = source, steps, drop_remainder
        self.read_again = read_again
        self.zeros = zeros
        self.restart = restart
        self.pad, self.where = pad, where
        self.steps = steps or source.num_batches
        self._passed: int | None = None  # batches in a whole pass of a source of unknown length
        iterator = self._iterator()
        try:
            first = next(iterator)
        except StopIteration:
            raise FitError(f"the {where} is empty; give at least one example") from None
        self._pending, self._carry = [first], iterator
        given = batch_size or source.batch_size or fit_batches.rows(first, where=where)
        if pad and round_up:  # padding weighs 0 in every metric: 7 is scored as 7 of 8
            given = fit_batches.check_batch_size(given, 1)
            given += -given % replicas
        if not pad and accum_steps == 1:  # as given: split as evenly as it goes, or whole
            self.size = fit_batches.check_batch_size(given, 1)
            if self.size < replicas:
                raise FitError(
                    f"batch_size={self.size} is smaller than the {replicas} replicas, which "
                    f"would leave one with no example; give at least {replicas}"
                )
        else:
            self.size = fit_batches.check_batch_size(given, replicas, accum_steps)
        self.first = self._made(first)

    def _iterator(self):
        return iter(self.source.get_numpy_iterator())

    def _made(self, data) -> dict | None:
        if self.pad:
            return fit_batches.padded(data, self.size, where=self.where, zeros=self.zeros)
        return fit_batches.as_given(data, self.size, where=self.where)

    def _check_length(self, count: int) -> None:
        """FitError where a source of unknown length (a generator, a dataset of unknown
        cardinality) ended a pass after another count of batches than its first pass: its
        epochs would train on different examples, unsaid (Keras's fit runs each to its end)."""
        if self.steps_given or self.source.num_batches is not None:
            return
        if self._passed is None:
            self._passed = count
        elif count != self._passed:
            steps = "validation_steps" if "validation" in self.where else "steps_per_epoch"
            raise FitError(
                f"the {self.where} ended after {count} batches this pass, {self._passed} "
                "in the first: it must give the same examples on every pass (a Python "
                "generator is used up after one pass; a changing source or a random filter "
                f"gives other counts); give {steps} to read a fixed count of batches "
                "each epoch (from a generator that never ends)"
            )

    def blocks(self, size: int, skip: int = 0):
        """The next epoch as blocks of up to ``size`` batches, its first ``skip`` batches left
        out (trained before a resume): gathered from NumPy arrays a block at a time where the
        source is arrays, else batch by batch."""
        import itertools

        from mirrorfit.fitting.arrays import array_blocks, arrays_of
        from mirrorfit.fitting.blocks import blocks

        arrays = arrays_of(self.source) if self.pad and not self.steps_given else None
        if arrays is None:
            return blocks(itertools.islice(self.epoch(), skip, None), size)
        self._pending = []  # the first batch was read for building only
        return array_blocks(
            self.source,
            arrays,
            self.size,
            size,
            drop_remainder=self.drop,
            skip=skip,
            zeros=self.zeros,
        )

    def resume_at(self, epoch: int) -> None:
        """Resumed at ``epoch`` in a new process: a tf.data dataset's iterators that the epochs
        before it made are made again and dropped unread, so that a seeded shuffle that
        reshuffles each pass (``reshuffle_each_iteration``: each iterator draws the next seed)
        gives this epoch the order the stopped run drew for it, not epoch 1's."""
        if not epoch or self.steps_given or type(self.source).__name__ != "TFDatasetAdapter":
            return  # arrays keep their generator's state in the checkpoint
        dataset = self.source.get_tf_dataset()
        # a run never stopped reads epoch 1 from the build's iterator, or (read_again) anew
        again = type(self.source).__name__ in self.read_again
        for _ in range(epoch if again else epoch - 1):
            iter(dataset)  # drawn and dropped: its seed is the epoch's
        self._pending, self._carry = [], None  # the build's batch was read for building only

    def epoch(self):
        """The batches of the next epoch (a generator)."""
        self.source.on_epoch_begin()
        if self._pending and type(self.source).__name__ in self.read_again:
            # the first batch was read to build the model; epoch 1 reads the source anew (a
            # shuffle drawn again), as Keras's fit does on this engine
            self._pending, self._carry = [], None
        if not self._pending and (self._carry is None or not self.steps_given or self.restart):
            self._carry = self._iterator()
        return self._generate()

    def _generate(self):
        count = 0
        try:
            while not self.steps_given or count < self.steps_given:
                if self._pending:
                    data = self._pending.pop()
                else:
                    data = next(self._carry, _END)
                    if data is _END:
                        self._carry = None
                        self._check_length(count)
                        return
                batch = self._made(data)
                if batch is None or (self.drop and fit_batches.rows_of(batch) < self.size):
                    continue
                count += 1
                yield batch
        finally:
            self.source.on_epoch_end()
