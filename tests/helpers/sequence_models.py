"""Sequence (stateful) Python models, the same for triton_nb and for real Triton: a per-card running
count and sum of amounts, kept in the model and keyed by the CORRID control input (the fraud use
case: how many transactions a card made so far in this sequence, and for how much)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.scale_models import write_python_model

CARD_COUNT_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.cards = {}

    def execute(self, requests):
        responses = []
        for slot, request in enumerate(requests):
            def one(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]

            shape = pb_utils.get_input_tensor_by_name(request, "AMOUNT").as_numpy().shape
            if not one("READY"):  # a null request padding an idle batch slot: no state change
                count, total = 0, 0.0
            else:
                # the card: its CORRID, or without one the batch slot, which the direct strategy
                # keeps for the sequence
                names = {tensor.name() for tensor in request.inputs()}
                card = one("CORRID") if "CORRID" in names else slot
                if one("START"):
                    self.cards[card] = (0, 0.0)
                count, total = self.cards.get(card, (0, 0.0))
                count, total = count + 1, total + float(one("AMOUNT"))
                self.cards[card] = (count, total)
                if one("END"):
                    del self.cards[card]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("COUNT", np.full(shape, count, np.int32)),
                pb_utils.Tensor("TOTAL", np.full(shape, total, np.float32))]))
        return responses
'''

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "AMOUNT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  {extra}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }}{corrid}
  ]
}}
"""

CORRID = """,
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}"""

#: name -> (max_batch_size, CORRID data type (None: no CORRID input), more sequence_batching
#: settings or None)
MODELS = {
    "card_count": (4, "TYPE_UINT64", None),  # four slots: sequences batch together
    "card_count_str": (2, "TYPE_STRING", None),  # string ids delivered as CORRID (see the real-Triton test)
    "card_count_slot": (2, None, None),  # no CORRID: the model keys its state by batch slot
    "card_count_flat": (0, "TYPE_UINT64", None),  # a model that does not batch: one slot, controls of shape [1]
    "card_count_one": (1, "TYPE_UINT64", None),  # one slot: a second sequence waits for it
    "card_count_idle": (4, "TYPE_UINT64", "max_sequence_idle_microseconds: 200000"),  # idle 0.2 s: released
    # the oldest strategy: sequences batch by CORRID, without slots of their own
    "card_count_oldest": (4, "TYPE_UINT64", "oldest { max_candidate_sequences: 8 preferred_batch_size: [ 4 ] }"),
}


def write_sequence_models(repo: Path) -> dict[str, Path]:
    """The card-count models of :data:`MODELS` in ``repo``."""
    folders = {}
    for name, (max_batch_size, corrid_type, extra) in MODELS.items():
        config = CONFIG.format(name=name, max_batch_size=max_batch_size,
                               corrid="" if corrid_type is None else CORRID.format(corrid_type=corrid_type),
                               extra=extra or "")
        folders[name] = write_python_model(repo, name, config, CARD_COUNT_MODEL)
    return folders


#: The interleaved requests of three cards, sent one after another: (card, amount, start, end,
#: expected count, expected total).
INTERLEAVED = [
    (11, 10.0, True, False, 1, 10.0),
    (12, 5.0, True, False, 1, 5.0),
    (11, 2.5, False, False, 2, 12.5),
    (13, 7.0, True, True, 1, 7.0),
    (12, 1.0, False, True, 2, 6.0),
    (11, 0.5, False, True, 3, 13.0),
]

NO_START = "must specify the START flag on the first request of the sequence"
NO_ID = "must specify a non-zero or non-empty correlation ID"


def send(client: object, protocol: str, model: str, card: int | str, amount: float, *, start: bool = False,
         end: bool = False) -> tuple[int, float]:
    """One request of a card's sequence over ``protocol`` ("inprocess", "http" or "grpc", with
    that protocol's client); returns (count, total) or raises the server's error."""
    import numpy as np

    shape = [1] if model == "card_count_flat" else [1, 1]
    amounts = np.full(shape, amount, np.float32)
    if protocol == "inprocess":
        parameters = {"sequence_id": card, "sequence_start": start, "sequence_end": end} if card else {}
        result = client.infer(model, {"AMOUNT": amounts}, parameters=parameters)
    else:
        if protocol == "http":
            import tritonclient.http as tc
        else:
            import tritonclient.grpc as tc
        tensor = tc.InferInput("AMOUNT", shape, "FP32")
        tensor.set_data_from_numpy(amounts)
        result = client.infer(model, [tensor], sequence_id=card, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("COUNT").reshape(-1)[0]), float(result.as_numpy("TOTAL").reshape(-1)[0])


def error_of(call: object) -> str:
    """The message of the error ``call()`` raises (AssertionError when it succeeds)."""
    try:
        call()
    except Exception as exc:  # each protocol's own error class: compared by text
        return str(exc)
    raise AssertionError("the request succeeded")


#: Two sequences with string ids on ``card_count_slot`` (state kept by batch slot): the second
#: sequence's requests reach the model in slot 1, after a null request in slot 0 when the first
#: has nothing queued. (sequence id, amount, start, end, expected count, expected total)
BY_SLOT = [
    ("card-a", 1.0, True, False, 1, 1.0),
    ("card-b", 2.0, True, False, 1, 2.0),
    ("card-a", 3.0, False, False, 2, 4.0),
    ("card-b", 4.0, False, True, 2, 6.0),
    ("card-a", 5.0, False, True, 3, 9.0),
]


ACCUMULATOR = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The card's running total of amounts, kept by the server as implicit state."""

    def execute(self, requests):
        responses = []
        for request in requests:
            def tensor(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

            amount = tensor("AMOUNT")
            total = amount if tensor("START").reshape(-1)[0] else tensor("TOTAL_IN") + amount
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", total.astype(np.float32)),
                                                         pb_utils.Tensor("TOTAL_OUT", total.astype(np.float32))]))
        return responses
'''

ACCUMULATOR_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "AMOUNT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  {strategy}
  control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ]
  state [ {{ input_name: "TOTAL_IN" output_name: "TOTAL_OUT" data_type: TYPE_FP32 dims: [ 1 ]
            initial_state: {{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zero" }} }} ]
}}
"""

#: name -> strategy
ACCUMULATORS = {"card_total": "", "card_total_oldest": "oldest { max_candidate_sequences: 8 }"}

def write_accumulators(repo: Path) -> None:
    """The card-total models of :data:`ACCUMULATORS` in ``repo``."""
    for name, strategy in ACCUMULATORS.items():
        write_python_model(repo, name, ACCUMULATOR_CONFIG.format(name=name, strategy=strategy), ACCUMULATOR)


def total(client: object, protocol: str, model: str, card: int, amount: float, *, start: bool = False,
          end: bool = False) -> float:
    """One request of a card's sequence to a card-total model; returns the TOTAL it answers."""
    import numpy as np

    amounts = np.full((1, 1), amount, np.float32)
    if protocol == "inprocess":
        result = client.infer(model, {"AMOUNT": amounts},
                              parameters={"sequence_id": card, "sequence_start": start, "sequence_end": end})
    else:
        if protocol == "http":
            import tritonclient.http as tc
        else:
            import tritonclient.grpc as tc
        tensor = tc.InferInput("AMOUNT", [1, 1], "FP32")
        tensor.set_data_from_numpy(amounts)
        result = client.infer(model, [tensor], sequence_id=card, sequence_start=start, sequence_end=end)
    return float(result.as_numpy("TOTAL").reshape(-1)[0])


#: Two cards' interleaved sequences on a card-total model: (card, amount, start, end, running total).
CARD_TOTALS = [
    (1, 10.0, True, False, 10.0),
    (2, 1.0, True, False, 1.0),
    (1, 5.0, False, False, 15.0),
    (2, 2.0, False, True, 3.0),
    (1, 0.5, False, True, 15.5),
]
