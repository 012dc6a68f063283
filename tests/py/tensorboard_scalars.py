"""The reference for tests/text_job.rs: TensorBoard's own reader of event files.

Prints {"tag": [[step, value], ...], ...} for every scalar in the event files under argv[1].
"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

accumulator = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
accumulator.Reload()
scalars = {tag: [[e.step, e.value] for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}
json.dump(scalars, sys.stdout)
